// One leader-election candidate built on the official Kubernetes Java client
// (io.kubernetes:client-java-extended, io.kubernetes.client.extended.leaderelection;
// the version pinned in pom.xml beside this file), run by the end-to-end
// tests as a real peer nobody here wrote:
//
//     Elector configmap|lease NAMESPACE LOCK IDENTITY [LEASE RENEW RETRY]
//
// It builds the library's ConfigMapLock or LeaseLock (NAMESPACE/LOCK, holder
// identity IDENTITY: the tests give the pod's name) and runs its
// LeaderElector with a lease of 60 s, a renew deadline of 50 s and a retry
// period of 2 s (or the given seconds); the elector is never closed (closing
// is what gives a held lock up). On stdout, flushed at once: "LEADING
// IDENTITY" once it leads, "NEW LEADER HOLDER" each time the library reports
// another holder (its onNewLeader hook, while it does not lead), "STOPPED
// IDENTITY" when its run ends (it lost the lead, or never got it). The
// kubeconfig is $KUBECONFIG. The library's own log lines (slf4j-simple, its
// leader-election package at debug) go to stderr.
//
// "Elector --check" only checks that the classpath holds what it uses.
// Built by hack/java-peer.sh java, which prints the launcher to run.

import io.kubernetes.client.extended.leaderelection.LeaderElectionConfig;
import io.kubernetes.client.extended.leaderelection.LeaderElector;
import io.kubernetes.client.extended.leaderelection.Lock;
import io.kubernetes.client.extended.leaderelection.resourcelock.ConfigMapLock;
import io.kubernetes.client.extended.leaderelection.resourcelock.LeaseLock;
import io.kubernetes.client.openapi.ApiClient;
import io.kubernetes.client.util.ClientBuilder;
import io.kubernetes.client.util.KubeConfig;
import java.io.FileReader;
import java.io.IOException;
import java.io.Reader;
import java.time.Duration;

public final class Elector {
  private static final String USAGE =
      "usage: Elector configmap|lease NAMESPACE LOCK IDENTITY [LEASE RENEW RETRY] (seconds; $KUBECONFIG)";

  private Elector() {}

  public static void main(String[] args) throws IOException {
    if (args.length == 1 && args[0].equals("--check")) {
      // hack/java-peer.sh: the classpath holds what the elector uses (the
      // locks, the elector's checks of its config, a client; no cluster).
      System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
      ApiClient client = new ClientBuilder().setBasePath("https://127.0.0.1:1").build();
      new ConfigMapLock("ns", "check", "check", client);
      Lock lock = new LeaseLock("ns", "check", "check", client);
      new LeaderElector(config(lock, 60, 50, 2)).close();
      say("classpath ok");
      return;
    }
    if ((args.length != 4 && args.length != 7)
        || !(args[0].equals("configmap") || args[0].equals("lease"))) {
      System.err.println(USAGE);
      System.exit(2);
    }
    // Before the first logger: slf4j-simple reads these once.
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
    System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSX");
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "info");
    System.setProperty(
        "org.slf4j.simpleLogger.log.io.kubernetes.client.extended.leaderelection", "debug");

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
    String kubeconfig = System.getenv("KUBECONFIG");
    if (kubeconfig == null || kubeconfig.isEmpty()) {
      System.err.println("KUBECONFIG is not set");
      System.exit(2);
    }
    ApiClient client;
    try (Reader r = new FileReader(kubeconfig)) {
      client = ClientBuilder.kubeconfig(KubeConfig.loadKubeConfig(r)).build();
    }
    Lock lock =
        kind.equals("lease")
            ? new LeaseLock(namespace, name, identity, client)
            : new ConfigMapLock(namespace, name, identity, client);
    System.err.printf(
        "java elector: %s lock %s/%s as %s (lease %d s, renew %d s, retry %d s)%n",
        kind, namespace, name, identity, lease, renew, retry);
    System.err.flush();

    // Runs until the lead is lost (the renew loop ends) or the process is
    // killed; leading is holding it, renewed by the library. Never closed:
    // close() is what releases a held lock.
    LeaderElector elector = new LeaderElector(config(lock, lease, renew, retry));
    elector.run(
        () -> say("LEADING " + identity),
        () -> say("STOPPED " + identity),
        holder -> say("NEW LEADER " + holder));
    say("ELECTOR ENDED " + identity);
    System.exit(1);
  }

  private static LeaderElectionConfig config(Lock lock, long lease, long renew, long retry) {
    return new LeaderElectionConfig(
        lock, Duration.ofSeconds(lease), Duration.ofSeconds(renew), Duration.ofSeconds(retry));
  }

  private static void say(String line) {
    System.out.println(line);
    System.out.flush();
  }
}
