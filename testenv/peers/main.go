// Command peers runs one real leader-election candidate, as a pod would:
//
//	peers become LOCK   operator-lib's leader.Become (leader for life, a
//	                    ConfigMap lock owned by the pod named by $POD_NAME, in
//	                    the namespace read from the service-account file)
//
// It prints "LEADING <pod>" once it leads and then holds the lead until it
// is killed. Logs go to stderr.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/operator-framework/operator-lib/leader"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	ctrl.SetLogger(zap.New(zap.UseDevMode(false), zap.WriteTo(os.Stderr)))
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: peers become LOCK")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch os.Args[1] {
	case "become":
		if err := leader.Become(ctx, os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "peers: leader.Become: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("LEADING %s\n", os.Getenv("POD_NAME"))
	default:
		fmt.Fprintf(os.Stderr, "peers: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	<-ctx.Done()
}
