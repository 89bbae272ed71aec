package mscheduler_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/mscheduler/mscheduler/clients/go"
)

// The README's worker in ten lines (compiled by go test, not run: it needs a server).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // a stop lets handlers finish
	defer stop()
	client := mscheduler.NewClient("http://127.0.0.1:8700", os.Getenv("MSCHEDULER_HTTP_TOKEN"))
	err := client.Work(ctx, []string{"thumbnail"}, func(ctx context.Context, task mscheduler.Task) (any, error) {
		var image struct{ Image string }
		return map[string]bool{"done": true}, json.Unmarshal(task.Payload, &image)
	}, mscheduler.WorkOptions{Concurrency: 8, Lease: 30 * time.Second,
		OnError: func(err error, _ *mscheduler.Lease) { log.Print("mscheduler: ", err) }})
	if err != nil {
		log.Fatal(err)
	}
}
