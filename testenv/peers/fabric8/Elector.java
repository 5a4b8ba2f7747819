// One leader-election candidate built on fabric8's Kubernetes client
// (io.fabric8:kubernetes-client, io.fabric8.kubernetes.client.extended.leaderelection;
// the version pinned in pom.xml beside this file), run by the end-to-end
// tests as a real peer nobody here wrote:
//
//     Elector configmap|lease NAMESPACE LOCK IDENTITY [LEASE RENEW RETRY]
//
// It builds ConfigMapLock or LeaseLock (NAMESPACE/LOCK, holder identity
// IDENTITY: the tests give the pod's name) and runs LeaderElector with a lease
// of 60 s, a renew deadline of 50 s and a retry period of 2 s (or the given
// seconds), not releasing the lock on cancel. On stdout, flushed at once:
// "LEADING IDENTITY" once it leads, "NEW LEADER HOLDER" each time the library
// sees the record name another holder (its onNewLeader), "STOPPED IDENTITY" if
// the library gives the lead up, "ELECTOR ENDED IDENTITY" (then exit 1) if its
// run returns. The kubeconfig is $KUBECONFIG (fabric8's own
// auto-configuration). The library's own log lines (slf4j-simple, its
// leader-election package at debug) go to stderr.
//
// "Elector --check" only checks that the classpath holds what it uses.
// Built and run by hack/fabric8-peer.sh, which prints the launcher to run.

import io.fabric8.kubernetes.client.Config;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.extended.leaderelection.LeaderCallbacks;
import io.fabric8.kubernetes.client.extended.leaderelection.LeaderElectionConfig;
import io.fabric8.kubernetes.client.extended.leaderelection.LeaderElectionConfigBuilder;
import io.fabric8.kubernetes.client.extended.leaderelection.resourcelock.ConfigMapLock;
import io.fabric8.kubernetes.client.extended.leaderelection.resourcelock.LeaseLock;
import io.fabric8.kubernetes.client.extended.leaderelection.resourcelock.Lock;
import java.time.Duration;

public final class Elector {
  private static final String USAGE =
      "usage: Elector configmap|lease NAMESPACE LOCK IDENTITY [LEASE RENEW RETRY] (seconds; $KUBECONFIG)";

  private Elector() {}

  public static void main(String[] args) {
    if (args.length == 1 && args[0].equals("--check")) {
      // hack/fabric8-peer.sh: the classpath holds what the elector uses.
      new LeaderElectionConfigBuilder()
          .withName("check")
          .withLock(new LeaseLock("ns", "check", "check"))
          .withLock(new ConfigMapLock("ns", "check", "check"))
          .withLeaseDuration(Duration.ofSeconds(60))
          .withRenewDeadline(Duration.ofSeconds(50))
          .withRetryPeriod(Duration.ofSeconds(2))
          .withLeaderCallbacks(new LeaderCallbacks(() -> {}, () -> {}, h -> {}))
          .build();
      new KubernetesClientBuilder().withConfig(Config.empty()).build().close();
      say("classpath ok");
      return;
    }
    if ((args.length != 4 && args.length != 7) || !(args[0].equals("configmap") || args[0].equals("lease"))) {
      System.err.println(USAGE);
      System.exit(2);
    }
    // Before the first logger: slf4j-simple reads these once.
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
    System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSX");
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "info");
    System.setProperty(
        "org.slf4j.simpleLogger.log.io.fabric8.kubernetes.client.extended.leaderelection", "debug");

    String kind = args[0];
    String namespace = args[1];
    String name = args[2];
    String identity = args[3];
    long lease = 60, renew = 50, retry = 2;
    if (args.length == 7) {
      lease = Long.parseLong(args[4]);
      renew = Long.parseLong(args[5]);
      retry = Long.parseLong(args[6]);
    }
    Lock lock =
        kind.equals("lease")
            ? new LeaseLock(namespace, name, identity)
            : new ConfigMapLock(namespace, name, identity);
    System.err.printf(
        "fabric8 elector: %s lock %s/%s as %s (lease %d s, renew %d s, retry %d s)%n",
        kind, namespace, name, identity, lease, renew, retry);
    System.err.flush();

    LeaderCallbacks callbacks =
        new LeaderCallbacks(
            () -> say("LEADING " + identity),
            () -> say("STOPPED " + identity),
            holder -> say("NEW LEADER " + holder));
    LeaderElectionConfig config =
        new LeaderElectionConfigBuilder()
            .withName(name)
            .withLock(lock)
            .withLeaseDuration(Duration.ofSeconds(lease))
            .withRenewDeadline(Duration.ofSeconds(renew))
            .withRetryPeriod(Duration.ofSeconds(retry))
            .withReleaseOnCancel(false)
            .withLeaderCallbacks(callbacks)
            .build();
    KubernetesClient client =
        new KubernetesClientBuilder().withConfig(Config.autoConfigure(null)).build();
    // Runs until the lead is lost (the renew loop ends) or the process is
    // killed; leading is holding it, renewed by the library.
    client.leaderElector().withConfig(config).build().run();
    say("ELECTOR ENDED " + identity);
    client.close();
    System.exit(1);
  }

  private static void say(String line) {
    System.out.println(line);
    System.out.flush();
  }
}
