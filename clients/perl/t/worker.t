# The Perl worker against a `mscheduler serve` this test starts (the project's .venv, or
# $MSCHEDULER_PYTHON, or python3), and beside Python consumers (a mixed fleet).
use strict;
use warnings;

use FindBin;
use File::Spec;
use IO::Socket::INET;
use Test::More;

use lib "$FindBin::Bin/../lib";
use MScheduler::Client;

my $root = File::Spec->rel2abs("$FindBin::Bin/../../..");
my $token = 'perl-token-0123456789abcdef';
my (@children, @pipes);    # a piped open's handle, once closed, waits for its process
END { local $?; kill INT => $_ for @children; waitpid $_, 0 for @children }

sub python {
    my @candidates = $ENV{MSCHEDULER_PYTHON} ? ($ENV{MSCHEDULER_PYTHON})
        : ((grep { -x } "$root/.venv/bin/python"), 'python3');
    local $ENV{PYTHONPATH} = $root;
    for my $python (@candidates) {
        return $python if system($python, '-c', 'import mscheduler.http, uvicorn') == 0;
    }
    BAIL_OUT("no Python here runs mscheduler serve (tried @candidates): run the project's set-up, or set MSCHEDULER_PYTHON");
}

sub start {    # a Python process that announces "serve: http://...:port/ " on stderr
    my (@args) = @_;
    my $python = python();
    local $ENV{PYTHONPATH} = $root;
    my $pid = open(my $stderr, '-|') // die "fork: $!";
    if ($pid == 0) {
        chdir $root;
        open STDERR, '>&', \*STDOUT;
        exec $python, @args or die "exec: $!";
    }
    push @children, $pid;
    push @pipes, $stderr;
    while (my $line = <$stderr>) {
        if ($line =~ m{serve: (http://\S+?)/ }) {
            my $reader = fork() // die;    # drain the rest, so the server never blocks on it
            if ($reader == 0) { 1 while <$stderr>; POSIX::_exit(0) }
            return $1;
        }
    }
    BAIL_OUT('the server exited before announcing its address');
}

my $url = start('-m', 'mscheduler', '--uri', "memory://perl-$$", 'serve', '--port', '0', '--token', $token);
my $client = MScheduler::Client->new(url => $url, token => $token);

subtest 'publish is idempotent by key' => sub {
    my ($task, $created) = $client->publish('pub:1', 'pub', payload => { n => 1 });
    ok $created;
    is $task->{state}, 'pending';
    ($task, $created) = $client->publish('pub:1', 'pub', payload => { n => 2 });
    ok !$created;
    is_deeply $task->{payload}, { n => 1 };
    is $client->get('pub:none'), undef;
    like $task->{created_at}, qr/Z$/, 'times in UTC with Z';
};

subtest 'own, extend, succeed; a lease is fenced' => sub {
    $client->publish("own:$_", 'own', options => { priority => $_ }) for 1, 2;
    my $leases = $client->own(['own'], worker_id => 'perl', max_tasks => 5, lease_ms => 10_000);
    is_deeply [map { $_->{key} } @$leases], ['own:2', 'own:1'], 'best first';
    my $extended = $client->extend($leases->[0], 20_000);
    is $extended->{run_id}, $leases->[0]{run_id};
    is $client->succeed($extended, { ok => JSON::PP::true })->{state}, 'success';
    eval { $client->succeed($leases->[0]) };
    is $@->code, 'lease_lost', 'a second outcome is lease_lost';
    is $@->status, 409;
    ok !MScheduler::Client::is_permanent($@);
    is $client->release($leases->[1])->{state}, 'pending';
};

subtest 'work runs each task once, extends a long one, fails a die' => sub {
    $client->publish("work:$_", 'work', payload => $_) for 1 .. 5;
    $client->publish('work:bad', 'work', payload => 'bad', options => { max_unexpected_retries => 0 });
    my $done = 0;
    $client->work(['work'], sub {
        my ($task) = @_;
        die "no\n" if $task->{payload} eq 'bad';
        select undef, undef, undef, 1.5 if $task->{payload} eq '1';    # outlives its first lease
        return { echoed => $task->{payload} };
    }, lease_ms => 600, wait_ms => 200, stop => sub {
        $done = grep { my $t = $client->get($_); $t->{state} =~ /^(success|fail)$/ } map { "work:$_" } 1 .. 5, 'bad';
        $done == 6;
    });
    for my $n (1 .. 5) {
        my $task = $client->get("work:$n");
        is $task->{state}, 'success', "work:$n";
        is scalar @{ $task->{worker_states} }, 1, "work:$n ran once";
        is_deeply $task->{result}, { echoed => $n };
    }
    my $bad = $client->get('work:bad');
    is $bad->{state}, 'fail';
    is $bad->{worker_states}[0]{error}{message}, 'no';
};

subtest 'an error retrying cannot mend stops work' => sub {
    for my $case ([MScheduler::Client->new(url => $url, token => 'wrong-token-0123456789'), ['x'], 401],
                  [MScheduler::Client->new(url => "$url/not-the-api", token => $token), ['x'], 404],
                  [$client, [], 422]) {
        my ($who, $names, $status) = @$case;
        my $reported = 0;
        eval { $who->work($names, sub { 1 }, wait_ms => 100, on_error => sub { $reported++ }) };
        is ref $@ && $@->status, $status, "stopped with $status";
        is $reported, 0;
    }
};

{
    package RevokedClient;    # its token is refused once the handler has started ($started)
    our @ISA = ('MScheduler::Client');
    our $started;
    sub extend {
        my ($self, $lease) = @_;
        return $lease unless -s $started;
        die MScheduler::Error->new(401, 'unauthorized', 'the token is wrong');
    }
}

subtest 'a permanent error mid-run ends the handler and releases its task' => sub {
    my $revoked = bless { %$client }, 'RevokedClient';
    $client->publish('revoked:1', 'revoked', options => { max_unexpected_retries => 0 });
    my $marker = $RevokedClient::started = File::Spec->catfile(File::Spec->tmpdir, "mscheduler-perl-$$.pid");
    unlink $marker;
    eval {
        $revoked->work(['revoked'], sub {
            open my $out, '>', $marker or die $!;
            print {$out} $$;
            close $out;
            sleep 30;    # a long run, cut short
        }, lease_ms => 300, wait_ms => 100);
    };
    is ref $@ && $@->status, 401, 'stopped with 401';
    my $pid = do { local @ARGV = ($marker); <> };
    unlink $marker;
    ok $pid && !kill(0, $pid), "the handler's process is gone";
    my $task = $client->get('revoked:1');
    is $task->{state}, 'pending', 'the task is claimable at once, not left to expire';
    is_deeply [map { $_->{state} } @{ $task->{worker_states} }], ['released'];
};

subtest 'a server that is down is reported each time' => sub {
    my $socket = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1:0');
    my $port = $socket->sockport;
    close $socket;
    my @reported;
    MScheduler::Client->new(url => "http://127.0.0.1:$port")->work(['x'], sub { 1 },
        on_error => sub { push @reported, $_[0] }, stop => sub { @reported >= 3 });
    is scalar @reported, 3;
    ok !MScheduler::Client::is_permanent($_) for @reported;
};

subtest 'a mixed fleet: Python consumers and the Perl worker run every task once' => sub {
    my $fleet_token = 'fleet-token-0123456789abcdef';
    my $fleet_url = start('clients/js/test/fleet_server.py', '--consumers', '1', '--token', $fleet_token);
    my $fleet = MScheduler::Client->new(url => $fleet_url, token => $fleet_token);
    my @keys = map { "fleet:$_" } 1 .. 100;
    my $publisher = fork() // die "fork: $!";    # published while the Perl worker works
    if ($publisher == 0) {
        $fleet->publish($_, 'fleet', payload => $_) for @keys;
        POSIX::_exit(0);
    }
    my %by;
    $fleet->work(['fleet'], sub { return { by => 'perl' } }, wait_ms => 200, stop => sub {
        my $listed = $fleet->request(GET => '/tasks?name=fleet&state=success&limit=1000')->{tasks};
        return 0 if @$listed < @keys;
        $by{ $_->{result}{by} }++ for @$listed;
        is scalar(grep { @{ $_->{worker_states} } != 1 } @$listed), 0, 'each ran once';
        return 1;
    });
    waitpid $publisher, 0;
    is $by{python} + $by{perl}, 100;
    ok $by{perl} > 0 && $by{python} > 0, "runs: python $by{python}, perl $by{perl}";
    diag "mixed fleet: python $by{python}, perl $by{perl}";
};

done_testing;
