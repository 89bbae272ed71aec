package MScheduler::Client;

# A worker and publisher for mscheduler's HTTP API, on Perl 5's core modules only
# (HTTP::Tiny, JSON::PP), written from docs/protocol.md and docs/operations/http-api.md.
#
#   my $client = MScheduler::Client->new(url => 'http://127.0.0.1:8700', token => $token);
#   $client->publish('thumb:42', 'thumbnail', payload => { image => 'a.png' });
#   $client->work(['thumbnail'], sub { my ($task) = @_; return { done => 1 } });
#
# Errors are MScheduler::Error objects (status, code, message), died with.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use Time::HiRes ();
use IO::Select;

our $VERSION = '0.1.0';

my $JSON = JSON::PP->new->utf8->canonical->allow_nonref;

sub new {
    my ($class, %args) = @_;
    die "url: required\n" unless $args{url};
    (my $url = $args{url}) =~ s{/+$}{};
    return bless {
        url   => $url,
        token => $args{token},
        http  => HTTP::Tiny->new(timeout => 330),    # an own or a wait holds up to 300 s
    }, $class;
}

sub token { my ($self, $token) = @_; $self->{token} = $token if @_ > 1; $self->{token} }

# One request: the decoded answer, or dies with an MScheduler::Error. A body is JSON, sent
# with Content-Type: application/json (the protocol: without it the body is not read).
sub request {
    my ($self, $method, $path, $body) = @_;
    my %headers = (accept => 'application/json');
    $headers{authorization} = "Bearer $self->{token}" if defined $self->{token};
    my %options = (headers => \%headers);
    if (defined $body) {
        $headers{'content-type'} = 'application/json';
        $options{content} = $JSON->encode($body);
    }
    my $reply = $self->{http}->request($method, "$self->{url}/v1$path", \%options);
    if ($reply->{status} == 599) {    # HTTP::Tiny's own: no connection, no answer
        die MScheduler::Error->new(0, 'unreachable', $reply->{content} =~ s/\s+$//r);
    }
    my $data = length($reply->{content} // '') ? eval { $JSON->decode($reply->{content}) } : undef;
    if ($reply->{status} >= 400) {
        my ($code, $message) = ref $data eq 'HASH' ? ($data->{error}, $data->{message}) : ();
        die MScheduler::Error->new($reply->{status}, $code // 'http_error',
            $message // "HTTP $reply->{status}");
    }
    return wantarray ? ($data, $reply->{status}) : $data;
}

sub _segment {    # a key or name in a path: percent-encoded as one segment
    my ($text) = @_;
    utf8::encode(my $bytes = $text);
    $bytes =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord $1)/ge;
    return $bytes;
}

# Publish a task, idempotently by key: (task, created). %params: payload and publish's
# parameters as the protocol names them (options, depends_on, allow_missing, delay_ms,
# debounce_ms, update_payload, replace_finished).
sub publish {
    my ($self, $key, $name, %params) = @_;
    my ($task, $status) = $self->request(POST => '/tasks', { key => $key, name => $name, %params });
    return wantarray ? ($task, $status == 201) : $task;
}

sub get {    # the task, or undef if there is none
    my ($self, $key) = @_;
    my $task = eval { $self->request(GET => '/tasks/' . _segment($key)) };
    return $task if $task;
    my $error = $@;
    return undef if ref $error && $error->code eq 'not_found';
    die $error;
}

sub wait_for {    # the task once ended; dies with a 408 `timeout` error if not in time
    my ($self, $key, $timeout_ms) = @_;
    $timeout_ms //= 30_000;
    return $self->request(GET => '/tasks/' . _segment($key) . "/wait?timeout_ms=$timeout_ms");
}

# Up to max_tasks leases of names, best first: [{key, worker_id, run_id, expires_at, task}].
sub own {
    my ($self, $names, %options) = @_;
    my %body = (names => $names, worker_id => $options{worker_id}, max_tasks => $options{max_tasks} // 1);
    for my $field (qw(lease_ms wait_ms)) {
        $body{$field} = $options{$field} if defined $options{$field};
    }
    return $self->request(POST => '/own', \%body)->{leases};
}

sub _fence { my ($lease) = @_; return map { $_ => $lease->{$_} } qw(key worker_id run_id) }

sub extend {
    my ($self, $lease, $lease_ms) = @_;
    return $self->request(POST => '/leases/extend',
        { _fence($lease), defined $lease_ms ? (lease_ms => $lease_ms) : () });
}

sub succeed {
    my ($self, $lease, $result) = @_;
    return $self->request(POST => '/leases/succeed', { _fence($lease), result => $result });
}

sub fail {
    my ($self, $lease, $error) = @_;
    $error = "$error";
    $error =~ s/\s+$//;
    return $self->request(POST => '/leases/fail', { _fence($lease), error => length $error ? $error : 'failed' });
}

sub release {
    my ($self, $lease) = @_;
    return $self->request(POST => '/leases/release', { _fence($lease) });
}

# An error retrying cannot mend: 400, 401, 403, 422, and 404 other than not_found.
sub is_permanent {
    my ($error) = @_;
    return 0 unless ref $error && $error->isa('MScheduler::Error');
    my $status = $error->status;
    return 1 if grep { $status == $_ } 400, 401, 403, 422;
    return $status == 404 && $error->code ne 'not_found' ? 1 : 0;
}

sub _backoff {    # seconds after the nth failure in a row: 0.1 doubling to 5, jittered
    my ($failures) = @_;
    my $wait = 0.1 * 2**($failures > 7 ? 6 : $failures - 1);
    $wait = 5 if $wait > 5;
    return $wait * (0.5 + rand() / 2);
}

# Own tasks of names and run handler on each, one at a time: the handler runs in a child
# process (fork) while this one extends its lease every third of lease_ms; its return value
# is the result, a die fails the attempt. Returns once `stop` (a code ref) says so, or dies
# with an error retrying cannot mend; any other error goes to on_error and is tried again.
# %options: lease_ms (30000), wait_ms (2000), worker_id, on_error, stop.
sub work {
    my ($self, $names, $handler, %options) = @_;
    my $lease_ms = $options{lease_ms} // 30_000;
    my $worker_id = $options{worker_id} // sprintf('perl-%d-%06x', $$, int rand 2**24);
    my $stop = $options{stop} // sub { 0 };
    my $report = sub { $options{on_error}->(@_) if $options{on_error} };
    my $failures = 0;
    until ($stop->()) {
        my $leases = eval {
            $self->own($names, worker_id => $worker_id, lease_ms => $lease_ms,
                wait_ms => $options{wait_ms} // 2_000);
        };
        unless ($leases) {
            my $error = $@;
            die $error if is_permanent($error);
            $failures += 1;
            $report->($error, undef);
            Time::HiRes::sleep(_backoff($failures));
            next;
        }
        $failures = 0;
        $self->_run($_, $handler, $lease_ms, $report) for @$leases;
    }
    return;
}

sub _run {
    my ($self, $lease, $handler, $lease_ms, $report) = @_;
    pipe(my $reader, my $writer) or die "pipe: $!";
    my $child = fork() // die "fork: $!";
    if ($child == 0) {    # the handler's process: its outcome, as JSON, on the pipe
        close $reader;
        my $result = eval { $handler->($lease->{task}, $lease) };
        my $outcome = $@ ne '' ? { error => "$@" } : { result => $result };
        print {$writer} $JSON->encode($outcome);
        close $writer;
        POSIX::_exit(0);
    }
    close $writer;
    my ($current, $text, $lost) = ($lease, '', 0);
    my $select = IO::Select->new($reader);
    while (1) {    # read the outcome; extend every third of the lease meanwhile
        if ($select->can_read($lease_ms / 3000)) {
            last unless sysread($reader, $text, 65536, length $text);
            next;
        }
        my $extended = eval { $self->extend($current, $lease_ms) };
        if ($extended) {
            $current = $extended;
            next;
        }
        my $error = $@;
        if (ref $error && $error->code eq 'lease_lost') {    # stop: nothing more is written
            ($lost = 1, kill TERM => $child);
            last;
        }
        if (is_permanent($error)) {
            # work stops: the handler is ended and waited for, and its task goes back unrun
            # (best effort: the server may refuse this too) instead of waiting out its lease,
            # whose expiry would count an attempt.
            kill TERM => $child;
            close $reader;
            waitpid($child, 0);
            eval { $self->release($current) };
            die $error;
        }
        $report->($error, $lease);
    }
    close $reader;
    waitpid($child, 0);
    return if $lost;
    my $outcome = eval { $JSON->decode($text) } // { error => "the handler's process ended: $?" };
    my $write = exists $outcome->{error}
        ? sub { $self->fail($current, $outcome->{error}) }
        : sub { $self->succeed($current, $outcome->{result}) };
    for (my $failures = 1; ; $failures += 1) {
        return if eval { $write->(); 1 };
        my $error = $@;
        return if ref $error && $error->code eq 'lease_lost';
        if (ref $error && $error->status == 422 && !exists $outcome->{error}) {
            # The result was refused (too large, not storable): the attempt fails with why.
            $outcome = { error => $error->message };
            $write = sub { $self->fail($current, $outcome->{error}) };
            next;
        }
        die $error if is_permanent($error);
        $report->($error, $lease);
        return if _expired($current);    # the server would refuse it now
        Time::HiRes::sleep(_backoff($failures));
    }
}

sub _expired {
    my ($lease) = @_;
    my ($y, $m, $d, $H, $M, $S) = ($lease->{expires_at} // '') =~
        /^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d(?:\.\d+)?)Z$/ or return 1;
    local $ENV{TZ} = 'UTC';
    POSIX::tzset();
    return POSIX::mktime(int $S, $M, $H, $d, $m - 1, $y - 1900) + ($S - int $S) <= Time::HiRes::time();
}

package MScheduler::Error;

use overload '""' => sub { my $self = shift; "$self->{status} $self->{code}: $self->{message}\n" }, fallback => 1;

sub new { my ($class, $status, $code, $message) = @_; bless { status => $status, code => $code, message => $message }, $class }
sub status  { $_[0]{status} }
sub code    { $_[0]{code} }
sub message { $_[0]{message} }

1;
