#!/usr/bin/env bash
# The build of the fabric8 peer (testenv/peers/fabric8/Elector.java on
# fabric8's Kubernetes client, Maven Central io.fabric8:kubernetes-client,
# pinned with its JDK HTTP client and slf4j-simple in
# testenv/peers/fabric8/pom.xml), whose
# io.fabric8.kubernetes.client.extended.leaderelection the end-to-end tests
# (tests/e2e/fabric8.rs) run as a real leader-election peer: hack/java-peer.sh
# fabric8, which builds every Java peer the same way (once per hash of pom
# and sources, into the cache's fabric8-peer/<hash>/) and prints the path of
# its launcher.
#
#   hack/fabric8-peer.sh           build it if missing, print its launcher
#   hack/fabric8-peer.sh --print   only print where its launcher is (or will be)
#   FABRIC8_VERSION=7.9.0 hack/fabric8-peer.sh   another release of the client
#       (the pom's fabric8.version overridden, e.g. 7.9.0: Jackson 2 where 8
#       has Jackson 3; a build of its own)
exec "$(dirname "${BASH_SOURCE[0]}")/java-peer.sh" fabric8 "$@" \
  ${FABRIC8_VERSION:+"fabric8.version=$FABRIC8_VERSION"}
