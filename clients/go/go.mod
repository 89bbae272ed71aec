module github.com/mscheduler/mscheduler/clients/go

go 1.19
