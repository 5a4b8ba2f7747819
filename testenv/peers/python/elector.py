"""One leader-election candidate built on the official Python client's
kubernetes.leaderelection (PyPI `kubernetes`, the version pinned in
requirements.txt beside this file), run by the end-to-end tests as a real
peer nobody here wrote:

    elector.py configmap|lease NAMESPACE LOCK IDENTITY [LEASE RENEW RETRY]

It builds ConfigMapLock or LeaseLock (NAMESPACE/LOCK, holder identity
IDENTITY) and runs LeaderElection with a lease of 60 s, a renew deadline of
50 s and a retry period of 2 s (or the given seconds). It prints
"LEADING IDENTITY" once it leads, then holds the lead (the library renews
it) until it is killed; "STOPPED IDENTITY" if the library gives the lead up.
The kubeconfig is $KUBECONFIG. The library's own log lines go to stderr.
"""

import logging
import sys
import threading

from kubernetes import config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.configmaplock import ConfigMapLock
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

LOCKS = {"configmap": ConfigMapLock, "lease": LeaseLock}


def main(argv):
    if len(argv) not in (5, 8) or argv[1] not in LOCKS:
        print(__doc__, file=sys.stderr)
        return 2
    kind, namespace, name, identity = argv[1:5]
    lease, renew, retry = (int(a) for a in argv[5:8]) if len(argv) == 8 else (60, 50, 2)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    config.load_kube_config()
    lock = LOCKS[kind](name, namespace, identity)
    leading = threading.Event()

    def started():
        print("LEADING {}".format(identity), flush=True)
        leading.set()
        # onstarted_leading runs in a thread of its own; returning is not
        # giving up the lead (the renew loop goes on), so just stay.
        threading.Event().wait()

    def stopped():
        print("STOPPED {}".format(identity), flush=True)

    print(
        "python elector: {} lock {}/{} as {} (lease {} s, renew {} s, retry {} s)".format(
            kind, namespace, name, identity, lease, renew, retry
        ),
        file=sys.stderr,
        flush=True,
    )
    cfg = electionconfig.Config(
        lock,
        lease_duration=lease,
        renew_deadline=renew,
        retry_period=retry,
        onstarted_leading=started,
        onstopped_leading=stopped,
    )
    leaderelection.LeaderElection(cfg).run()
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
