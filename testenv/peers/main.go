// Command peers runs one real leader-election candidate, as a pod would:
//
//	peers become LOCK   operator-lib's leader.Become (leader for life, a
//	                    ConfigMap lock owned by the pod named by $POD_NAME, in
//	                    the namespace read from the service-account file)
//	peers elect LEASE DURATION [RENEW_DEADLINE RETRY_PERIOD]
//	                    controller-runtime's Lease lock (identity
//	                    <hostname>_<uuid>, the hostname being $POD_NAME as in a
//	                    pod) driven by client-go's leader elector, with a
//	                    lease of DURATION (e.g. 60s), renew deadline 2/3 of
//	                    it, retry period 2s, as a manager would run it; or
//	                    with the given renew deadline and retry period
//	                    (OpenShift's library-go: 137s 107s 26s)
//	peers forlife LEASE a Lease held for life, as nais/elector's candidate
//	                    holds one: it only ever creates the Lease, owned by
//	                    its pod ($POD_NAME), holder identity the pod name,
//	                    acquireTime set, never renewed; finding it there
//	                    means it lost, and it tries again every second
//
// It prints "LEADING <pod>" once it leads and then holds the lead until it
// is killed. Logs go to stderr.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/operator-framework/operator-lib/leader"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	crleader "sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
)

// noEvents: the candidate records no Events (the janitor's are checked).
type noEvents struct{}

func (noEvents) GetEventRecorderFor(string) record.EventRecorder { return &record.FakeRecorder{} }
func (noEvents) GetEventRecorder(string) recorder.EventRecorder  { return silent{} }

type silent struct{}

func (silent) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...interface{}) {
}
func (silent) AnnotatedEventf(runtime.Object, runtime.Object, map[string]string, string, string, string, string, ...interface{}) {
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "peers: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	ctrl.SetLogger(zap.New(zap.UseDevMode(false), zap.WriteTo(os.Stderr)))
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: peers become LOCK | peers elect LEASE DURATION | peers forlife LEASE")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pod := os.Getenv("POD_NAME")
	switch os.Args[1] {
	case "become":
		if err := leader.Become(ctx, os.Args[2]); err != nil {
			die("leader.Become: %v", err)
		}
		fmt.Printf("LEADING %s\n", pod)
		<-ctx.Done()
	case "elect":
		if len(os.Args) < 4 {
			die("elect needs LEASE DURATION")
		}
		elect(ctx, pod, os.Args[2], os.Args[3], os.Args[4:])
	case "forlife":
		forLife(ctx, pod, os.Args[2])
	default:
		fmt.Fprintf(os.Stderr, "peers: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func elect(ctx context.Context, pod, lease, duration string, timings []string) {
	d, err := time.ParseDuration(duration)
	if err != nil {
		die("duration %q: %v", duration, err)
	}
	renew, retry := d*2/3, 2*time.Second
	switch len(timings) {
	case 0:
	case 2:
		if renew, err = time.ParseDuration(timings[0]); err != nil {
			die("renew deadline %q: %v", timings[0], err)
		}
		if retry, err = time.ParseDuration(timings[1]); err != nil {
			die("retry period %q: %v", timings[1], err)
		}
	default:
		die("elect takes LEASE DURATION [RENEW_DEADLINE RETRY_PERIOD]")
	}
	// In a pod the hostname is the pod name; this runs in its own UTS
	// namespace (unshare --uts), so setting it touches nothing else.
	if err := syscall.Sethostname([]byte(pod)); err != nil {
		die("setting the hostname to %s (run under unshare --uts): %v", pod, err)
	}
	cfg := ctrl.GetConfigOrDie()
	lock, err := crleader.NewResourceLock(cfg, noEvents{}, crleader.Options{
		LeaderElection:          true,
		LeaderElectionID:        lease,
		LeaderElectionNamespace: namespace(),
		RenewDeadline:           renew,
	})
	if err != nil {
		die("resource lock: %v", err)
	}
	fmt.Fprintf(os.Stderr, "peers: candidate %s for lease %s\n", lock.Identity(), lease)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: d,
		RenewDeadline: renew,
		RetryPeriod:   retry,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { fmt.Printf("LEADING %s\n", pod) },
			OnStoppedLeading: func() { fmt.Fprintln(os.Stderr, "peers: stopped leading") },
		},
	})
}

// namespace is the pod's namespace, as the kubelet mounts it.
func namespace() string {
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		die("reading the namespace: %v", err)
	}
	return strings.TrimSpace(string(ns))
}

// forLife is a candidate for a Lease held for life (the behaviour of
// nais/elector's candidate, written anew): it reads its own pod, then creates
// the Lease owned by it, holder identity the pod name, acquireTime now, no
// renewTime and no leaseDurationSeconds. AlreadyExists (or a conflict) means
// another pod holds it: it tries again a second later (nais/elector wakes on
// a watch of the Lease; a second stands in for that). Once it has created
// the Lease it leads until it is killed and never writes the Lease again.
func forLife(ctx context.Context, pod, lease string) {
	ns := namespace()
	cs := kubernetes.NewForConfigOrDie(ctrl.GetConfigOrDie())
	me, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		die("reading its own pod %s/%s: %v", ns, pod, err)
	}
	lost := false
	for {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      lease,
				Namespace: ns,
				OwnerReferences: []metav1.OwnerReference{
					{APIVersion: "v1", Kind: "Pod", Name: me.Name, UID: me.UID},
				},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &pod,
				AcquireTime:    &metav1.MicroTime{Time: time.Now()},
			},
		}
		_, err := cs.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{})
		switch {
		case err == nil:
			fmt.Printf("LEADING %s\n", pod)
			<-ctx.Done()
			return
		case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
			if !lost {
				lost = true
				fmt.Fprintf(os.Stderr, "peers: lost the election for lease %s/%s; trying again every second\n", ns, lease)
			}
		default:
			fmt.Fprintf(os.Stderr, "peers: creating lease %s/%s: %v\n", ns, lease, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
