//! An optional real node: containerd 2.x with runc, the CNI bridge, a kubelet
//! and kube-scheduler, all built by `testenv/build-node.sh` (`make node-up`)
//! beside the control plane's binaries. The simulated kubelet ([`crate::kubelet`])
//! stays for everything else.
//!
//! ```no_run
//! # async fn t() -> Result<(), lock_janitor_testenv::Error> {
//! use lock_janitor_testenv::{node, ControlPlane};
//! let prep = node::Prepared::new()?;                     // tokens, before the apiserver
//! let cp = ControlPlane::start(prep.control_plane_options()).await?;
//! let n = node::Node::start(&prep, cp.kubeconfig_path(), cp.dir(), node::NodeOptions::default()).await?;
//! n.import_images()?;                                    // pause, peers, hog, the janitor
//! # Ok(()) }
//! ```
//!
//! How this machine is a node (cgroup v1 in hybrid mode, no systemd as PID 1,
//! no iptables): the kubelet runs with `failCgroupV1: false` and the cgroupfs
//! driver; pods get addresses from the CNI bridge (`lj-cni0`, 10.88.0.0/24,
//! host-local, no masquerade: nothing leaves the machine). Pods reach the API
//! server as in-cluster clients do, at the `kubernetes` Service
//! (`KUBERNETES_SERVICE_HOST=10.0.0.1`, port 443): this module puts 10.0.0.1
//! on the loopback device and forwards 10.0.0.1:443 to the apiserver's
//! 127.0.0.1 port, the one Service a kube-proxy would serve here. (The
//! apiserver keeps listening on loopback only and its serving certificate
//! already names 10.0.0.1.)
//!
//! The kubelet and kube-scheduler authenticate with static tokens
//! (`--token-auth-file`): the kubelet as `system:node:<name>` in
//! `system:nodes` (so the Node authorizer and NodeRestriction apply as on a
//! real cluster, and the audit log tells its writes apart), the scheduler as
//! `system:kube-scheduler`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::process::{self, Proc};
use crate::{binary, io_err, Error, Options, KUBERNETES_SERVICE_IP};

/// The node's name (and the kubelet's user `system:node:<NODE_NAME>`).
pub const NODE_NAME: &str = "lj-node";
/// The kubelet's user in the audit log.
pub const KUBELET_USER: &str = "system:node:lj-node";
/// kube-scheduler's user.
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
/// The CNI bridge and its gateway (the node's address as pods see it).
pub const BRIDGE: &str = "lj-cni0";
pub const POD_SUBNET: &str = "10.88.0.0/24";
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
/// The sandbox image containerd's CRI asks for (built from pause.c, never pulled).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// Images [`Node::import_images`] builds and imports.
pub const PEERS_IMAGE: &str = "lock-janitor.local/peers:dev";
pub const HOG_IMAGE: &str = "lock-janitor.local/hog:dev";
pub const JANITOR_IMAGE_REPO: &str = "lock-janitor.local/lock-janitor";
pub const JANITOR_IMAGE_TAG: &str = "dev";
const CONTAINERD_NS: &str = "k8s.io";
const DIR_PREFIX: &str = "lock-janitor-node-";
/// Controllers a node needs beyond the control plane's defaults: Deployments,
/// PodDisruptionBudgets (the chart has one; the Eviction API consults it),
/// node lifecycle (NotReady, taints) and taint eviction.
const CONTROLLERS: &str = "root-ca-certificate-publisher-controller,pod-garbage-collector-controller,replicaset-controller,deployment-controller,disruption-controller,serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,node-lifecycle-controller,taint-eviction-controller";

/// The node's directory and credentials, made before the control plane
/// starts (the apiserver reads the token file at start).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub dir: PathBuf,
    kubelet_token: String,
    scheduler_token: String,
}

impl Prepared {
    /// A fresh node dir under the temp dir, with the token file.
    pub fn new() -> Result<Prepared, Error> {
        Self::new_in(&std::env::temp_dir())
    }

    /// As [`new`](Self::new), with the node dir under `parent`.
    pub fn new_in(parent: &Path) -> Result<Prepared, Error> {
        reap_stale();
        let dir = (0..)
            .map(|n| parent.join(format!("{DIR_PREFIX}{}-{n}", std::process::id())))
            .find(|d| !d.exists())
            .expect("a free name");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let p = Prepared {
            dir,
            kubelet_token: token(),
            scheduler_token: token(),
        };
        crate::write_private(
            &p.token_file(),
            &format!(
                "{},{KUBELET_USER},{KUBELET_USER},\"system:nodes\"\n{},{SCHEDULER_USER},{SCHEDULER_USER},\n",
                p.kubelet_token, p.scheduler_token
            ),
        )?;
        Ok(p)
    }

    fn token_file(&self) -> PathBuf {
        self.dir.join("tokens.csv")
    }

    /// The control plane's options for this node: the token file, the
    /// controllers a node needs, node lifecycle on (10 s grace).
    pub fn control_plane_options(&self) -> Options {
        let mut o = Options {
            node_lifecycle: true,
            ..Options::default()
        };
        self.add_to(&mut o);
        o
    }

    /// Adds this node's apiserver and controller-manager arguments to `o`.
    pub fn add_to(&self, o: &mut Options) {
        o.node_lifecycle = true;
        o.extra_apiserver_args
            .push(format!("--token-auth-file={}", self.token_file().display()));
        // The last --controllers wins over the control plane's own list.
        o.extra_controller_manager_args
            .push(format!("--controllers={CONTROLLERS}"));
    }
}

fn token() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How the node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The kubelet's `evictionHard` `memory.available` (e.g. "1Gi", or a
    /// percentage). Default "100Mi", as a kubelet's default.
    pub memory_available: String,
    /// Tie the processes to this one (tests) or let them outlive it (`testenv up --node`).
    pub detached: bool,
    /// For `detached`: the program that serves the `kubernetes` Service
    /// (`<exe> node-forward LISTEN TARGET`); in-process (a thread) when None.
    pub forwarder_exe: Option<PathBuf>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            memory_available: "100Mi".into(),
            detached: false,
            forwarder_exe: None,
        }
    }
}

/// A running node. Stopped (pods removed, processes stopped, mounts and dir
/// removed) on drop, unless [`detach`](Node::detach)ed.
pub struct Node {
    dir: PathBuf,
    bin: PathBuf,
    kubeconfig: PathBuf,
    opts: Mutex<NodeOptions>,
    procs: Mutex<Vec<Proc>>,
    forward_stop: Option<Arc<AtomicBool>>,
    released: bool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("dir", &self.dir).finish()
    }
}

/// What `testenv up --node` records to stop the node later.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DetachedNode {
    pub dir: PathBuf,
    pub processes: Vec<crate::ProcessInfo>,
}

fn is_tied(opts: &NodeOptions) -> bool {
    !opts.detached
}

/// Every binary of the real node is built.
fn all_built(bin: &Path) -> Result<(), Error> {
    for b in [
        "kubelet",
        "kube-scheduler",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "crictl",
        "pause",
        "cni/bridge",
        "cni/host-local",
        "cni/loopback",
    ] {
        binary(b).map_err(|_| {
            Error::Other(format!(
                "the real node's {b} is not built ({}): run `make node-up` or testenv/build-node.sh",
                bin.join(b).display()
            ))
        })?;
    }
    Ok(())
}

impl Node {
    /// Starts containerd, the `kubernetes` Service forwarder, kube-scheduler
    /// and the kubelet against the control plane of `admin_kubeconfig` (its
    /// dir `cp_dir` holds `pki/ca.crt`), and waits until the node is Ready.
    pub async fn start(
        prep: &Prepared,
        admin_kubeconfig: &Path,
        cp_dir: &Path,
        opts: NodeOptions,
    ) -> Result<Node, Error> {
        let bin = crate::bin_dir();
        all_built(&bin)?;
        host_checks()?;
        let ca = std::fs::read_to_string(cp_dir.join("pki").join("ca.crt"))
            .map_err(io_err("reading the control plane's pki/ca.crt"))?;
        let server = server_of(admin_kubeconfig)?;
        let port: u16 = server
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .ok_or_else(|| Error::Other(format!("no port in {server}")))?;
        let dir = prep.dir.clone();
        let mut node = Node {
            dir: dir.clone(),
            bin: bin.clone(),
            kubeconfig: admin_kubeconfig.to_path_buf(),
            opts: Mutex::new(opts.clone()),
            procs: Mutex::new(Vec::new()),
            forward_stop: None,
            released: false,
        };
        for (name, token) in [
            ("kubelet", &prep.kubelet_token),
            ("kube-scheduler", &prep.scheduler_token),
        ] {
            crate::write_private(
                &dir.join(format!("{name}.kubeconfig")),
                &token_kubeconfig(&server, &ca, name, token),
            )?;
        }
        crate::write_private(&dir.join("ca.crt"), &ca)?;
        if opts.detached {
            // Outlives this process: the reaper of dead tests' dirs keeps it.
            crate::write_private(&dir.join("detached"), "testenv up --node\n")?;
        }
        node.write_containerd_config()?;
        node.write_cni_config()?;

        // containerd
        let mut cmd = Command::new(bin.join("containerd"));
        cmd.arg("--config")
            .arg(dir.join("containerd.toml"))
            .env("PATH", path_with(&bin));
        node.spawn("containerd", cmd)?;
        node.wait("containerd", Duration::from_secs(60), |n| {
            n.crictl(&["info"]).map(|_| ())
        })
        .await?;

        // The `kubernetes` Service: 10.0.0.1:443 -> the apiserver.
        node.forward_service(port, &opts)?;

        // kube-scheduler
        let kc = dir.join("kube-scheduler.kubeconfig");
        let sched_port = free_port()?;
        let mut cmd = Command::new(bin.join("kube-scheduler"));
        cmd.arg(format!("--kubeconfig={}", kc.display()))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={sched_port}"))
            .arg("--v=1");
        node.spawn("kube-scheduler", cmd)?;

        node.start_kubelet().await?;
        Ok(node)
    }

    /// The `kubernetes` Service's address (10.0.0.1:443) forwarded to the
    /// API server's `port`: by a process of its own when detached, else by
    /// a thread of this one.
    fn forward_service(&mut self, port: u16, opts: &NodeOptions) -> Result<(), Error> {
        let listen = SocketAddr::from((KUBERNETES_SERVICE_IP, 443));
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        add_service_ip()?;
        match (&opts.forwarder_exe, opts.detached) {
            (Some(exe), true) => {
                let mut cmd = Command::new(exe);
                cmd.arg("node-forward")
                    .arg(listen.to_string())
                    .arg(target.to_string());
                self.spawn("service-forwarder", cmd)?;
            }
            _ => {
                let l = TcpListener::bind(listen).map_err(io_err(format!(
                    "listening on {listen} (the kubernetes Service)"
                )))?;
                let stop = Arc::new(AtomicBool::new(false));
                self.forward_stop = Some(stop.clone());
                std::thread::Builder::new()
                    .name("testenv-node-forward".into())
                    .spawn(move || serve_forward(l, target, stop))
                    .map_err(io_err("starting the forwarder thread"))?;
            }
        }
        Ok(())
    }

    fn write_containerd_config(&self) -> Result<(), Error> {
        let d = &self.dir;
        let s = |p: &Path| p.display().to_string();
        let cfg = format!(
            r#"# The real node's containerd (testenv/src/node.rs): state under the node dir.
version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine's root lacks CAP_SYS_RESOURCE (not in the bounding set), so
  # runc cannot lower a process's oom_score_adj below its parent's: the
  # sandbox's -998 and a Guaranteed container's -997 fail with "failed to
  # update /proc/self/oom_score_adj: Permission denied". containerd clamps
  # them to its own (0) instead, as for rootless. Only the kernel OOM
  # killer's order changes; the kubelet's eviction ranking does not use it.
  restrict_oom_score_adj = true
  # The pods' network namespaces are mounted under the node dir, not
  # /var/run/netns: what a killed run leaves is unmounted with the rest.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            root = s(&d.join("containerd/root")),
            state = s(&d.join("containerd/state")),
            sock = s(&self.socket()),
            runc = s(&self.bin.join("runc")),
            cni_bin = s(&self.bin.join("cni")),
            cni_conf = s(&d.join("cni/net.d")),
        );
        std::fs::create_dir_all(d.join("containerd"))
            .map_err(io_err("creating the containerd dir"))?;
        crate::write_private(&d.join("containerd.toml"), &cfg)
    }

    fn write_cni_config(&self) -> Result<(), Error> {
        let net = self.dir.join("cni/net.d");
        std::fs::create_dir_all(&net).map_err(io_err("creating the CNI conf dir"))?;
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "lock-janitor-node",
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY.to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.dir.join("cni/ipam").display().to_string(),
                },
            }],
        });
        crate::write_private(&net.join("10-lock-janitor.conflist"), &conf.to_string())
    }

    fn kubelet_config(&self) -> String {
        let d = &self.dir;
        let mem = self
            .opts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .memory_available
            .clone();
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (hybrid) and no systemd as PID 1.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{sock}
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: AlwaysAllow}}
podLogsDir: "{logs}"
failSwapOn: false
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
evictionHard:
  memory.available: "{mem}"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
evictionPressureTransitionPeriod: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
"#,
            sock = self.socket().display(),
            port = free_port().unwrap_or(10250),
            healthz = self.healthz_port(),
            ca = d.join("ca.crt").display(),
            logs = d.join("pod-logs").display(),
        )
    }

    fn healthz_port(&self) -> u16 {
        // One port per node dir, picked once.
        let f = self.dir.join("kubelet-healthz-port");
        if let Some(p) = std::fs::read_to_string(&f)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return p;
        }
        let p = free_port().unwrap_or(10248);
        let _ = std::fs::write(&f, p.to_string());
        p
    }

    /// Starts the kubelet (again, after [`stop_kubelet`](Self::stop_kubelet))
    /// and waits until the node is Ready.
    pub async fn start_kubelet(&self) -> Result<(), Error> {
        let d = &self.dir;
        std::fs::create_dir_all(d.join("pod-logs")).map_err(io_err("creating pod-logs"))?;
        crate::write_private(&d.join("kubelet.yaml"), &self.kubelet_config())?;
        let mut cmd = Command::new(self.bin.join("kubelet"));
        cmd.arg(format!("--config={}", d.join("kubelet.yaml").display()))
            .arg(format!(
                "--kubeconfig={}",
                d.join("kubelet.kubeconfig").display()
            ))
            .arg(format!("--root-dir={}", d.join("kubelet").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg("--v=2")
            .env("PATH", path_with(&self.bin));
        // A restarted kubelet keeps its earlier log.
        let log = d.join("kubelet.log");
        if log.exists() {
            let n = (1..)
                .find(|n| !d.join(format!("kubelet.{n}.log")).exists())
                .unwrap_or(1);
            let _ = std::fs::rename(&log, d.join(format!("kubelet.{n}.log")));
        }
        self.spawn("kubelet", cmd)?;
        self.wait_ready(Duration::from_secs(120)).await
    }

    /// Kills the kubelet (SIGKILL: no status update on the way out). The
    /// containers run on; the node turns NotReady after the node-monitor
    /// grace period.
    pub fn stop_kubelet(&self) {
        self.kill_component("kubelet");
    }

    fn kill_component(&self, name: &str) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = procs.iter().position(|p| p.name == name) {
            let mut p = procs.remove(i);
            process::signal(p.child.id(), libc::SIGKILL);
            let _ = p.child.wait();
        }
    }

    /// Restarts the kubelet with another `evictionHard` `memory.available`.
    pub async fn set_memory_available(&self, threshold: &str) -> Result<(), Error> {
        self.opts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .memory_available = threshold.to_string();
        self.stop_kubelet();
        self.start_kubelet().await
    }

    /// Stops every pod sandbox through the CRI (the kubelet must be stopped
    /// first, or it starts them again): the node's workloads die as in a
    /// power-off while containerd stays up to clean up.
    pub fn stop_all_pods(&self) -> Result<(), Error> {
        let out = self.crictl(&["pods", "-q"])?;
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = self.crictl(&["stopp", id]);
        }
        Ok(())
    }

    /// Waits until the Node object is Ready (the kubelet registered and reports).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let client = self.admin().await?;
        let nodes: Api<NodeObject> = Api::all(client);
        let start = Instant::now();
        let mut last = String::from("not registered");
        loop {
            if let Some(code) = self.exited("kubelet") {
                return Err(Error::Exited {
                    component: "kubelet",
                    status: code,
                    log: self.log("kubelet"),
                    tail: self.tail("kubelet", 30),
                });
            }
            match nodes.get_opt(NODE_NAME).await {
                Ok(Some(n)) => {
                    let ready = n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()));
                    match ready {
                        Some((s, _)) if s == "True" => return Ok(()),
                        Some((s, m)) => last = format!("Ready={s}: {m}"),
                        None => last = "no Ready condition".into(),
                    }
                }
                Ok(None) => {}
                Err(e) => last = e.to_string(),
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    component: "kubelet",
                    secs: timeout.as_secs(),
                    last,
                    log: self.log("kubelet"),
                    tail: self.tail("kubelet", 30),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn wait<F>(&self, component: &'static str, timeout: Duration, f: F) -> Result<(), Error>
    where
        F: Fn(&Node) -> Result<(), Error>,
    {
        let start = Instant::now();
        loop {
            if let Some(code) = self.exited(component) {
                return Err(Error::Exited {
                    component,
                    status: code,
                    log: self.log(component),
                    tail: self.tail(component, 30),
                });
            }
            match f(self) {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() > timeout => {
                    return Err(Error::Timeout {
                        component,
                        secs: timeout.as_secs(),
                        last: e.to_string(),
                        log: self.log(component),
                        tail: self.tail(component, 30),
                    })
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn exited(&self, component: &str) -> Option<String> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let p = procs.iter_mut().find(|p| p.name == component)?;
        match p.child.try_wait() {
            Ok(Some(st)) => Some(st.to_string()),
            _ => None,
        }
    }

    async fn admin(&self) -> Result<kube::Client, Error> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| Error::Other(format!("reading {}: {e}", self.kubeconfig.display())))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Other(e.to_string()))?;
        Ok(kube::Client::try_from(config)?)
    }

    fn spawn(&self, name: &'static str, mut cmd: Command) -> Result<(), Error> {
        let log = self.log(name);
        let out =
            std::fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err("duplicating a log handle"))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(&self.dir);
        let tied = is_tied(&self.opts.lock().unwrap_or_else(|e| e.into_inner()));
        let child = if tied {
            process::spawn_tied(cmd)
        } else {
            process::spawn_detached(cmd)
        }
        .map_err(io_err(format!("starting {name}")))?;
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Proc { name, child });
        Ok(())
    }

    /// The node dir (logs, containerd and kubelet state).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log of a component: containerd, kubelet, kube-scheduler.
    pub fn log(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    /// The kubelet's log since its last start.
    pub fn kubelet_log(&self) -> String {
        std::fs::read_to_string(self.log("kubelet")).unwrap_or_default()
    }

    fn tail(&self, component: &str, n: usize) -> String {
        crate::tail(
            &std::fs::read_to_string(self.log(component)).unwrap_or_default(),
            n,
        )
    }

    /// containerd's CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    /// Runs crictl against this node's containerd; an error if it fails.
    pub fn crictl(&self, args: &[&str]) -> Result<Output, Error> {
        let ep = format!("unix://{}", self.socket().display());
        let conf = self.dir.join("crictl.yaml");
        if !conf.exists() {
            let _ = std::fs::write(
                &conf,
                format!("runtime-endpoint: {ep}\nimage-endpoint: {ep}\n"),
            );
        }
        run_ok(
            Command::new(self.bin.join("crictl"))
                .arg("--config")
                .arg(&conf)
                .arg("--runtime-endpoint")
                .arg(&ep)
                .arg("--image-endpoint")
                .arg(&ep)
                .arg("--timeout=10s")
                .args(args),
            "crictl",
        )
    }

    /// Runs ctr (namespace k8s.io) against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> Result<Output, Error> {
        run_ok(
            Command::new(self.bin.join("ctr"))
                .arg("--address")
                .arg(self.socket())
                .arg("--namespace")
                .arg(CONTAINERD_NS)
                .args(args),
            "ctr",
        )
    }

    /// Imports an OCI image archive into the node's containerd (k8s.io namespace).
    pub fn import_archive(&self, tar: &Path) -> Result<(), Error> {
        self.ctr(&[
            "images",
            "import",
            "--no-unpack",
            "--all-platforms",
            &tar.display().to_string(),
        ])?;
        Ok(())
    }

    /// Builds and imports the node's images: the pause image, the peers
    /// (operator-lib, static), the memory hog, and the janitor from
    /// `janitor_bin` (a static musl build) when given: user 65532, entrypoint
    /// `/lock-janitor run`, as the release image.
    pub fn import_images(&self, janitor_bin: Option<&Path>) -> Result<Vec<String>, Error> {
        let images = self.dir.join("images");
        std::fs::create_dir_all(&images).map_err(io_err("creating the images dir"))?;
        let script = testenv_dir().join("node/oci-image.py");
        let peers = static_peers(&images)?;
        let hog = static_hog(&images)?;
        let mut built = vec![
            (
                PAUSE_IMAGE.to_string(),
                vec![
                    "--user=65535:65535".to_string(),
                    r#"--entrypoint=["/pause"]"#.to_string(),
                    format!("{}:/pause", self.bin.join("pause").display()),
                ],
            ),
            (
                PEERS_IMAGE.to_string(),
                vec![
                    "--user=65532:65532".to_string(),
                    r#"--entrypoint=["/peers"]"#.to_string(),
                    format!("{}:/peers", peers.display()),
                ],
            ),
            (
                HOG_IMAGE.to_string(),
                vec![
                    "--user=65532:65532".to_string(),
                    r#"--entrypoint=["/hog"]"#.to_string(),
                    format!("{}:/hog", hog.display()),
                ],
            ),
        ];
        if let Some(j) = janitor_bin {
            built.push((
                format!("{JANITOR_IMAGE_REPO}:{JANITOR_IMAGE_TAG}"),
                vec![
                    "--user=65532:65532".to_string(),
                    r#"--entrypoint=["/lock-janitor","run"]"#.to_string(),
                    format!("{}:/lock-janitor", j.display()),
                ],
            ));
        }
        let mut names = Vec::new();
        for (name, args) in built {
            let tar = images.join(format!("{}.tar", name.replace(['/', ':'], "_")));
            run_ok(
                Command::new("python3")
                    .arg(&script)
                    .arg(format!("--name={name}"))
                    .arg(format!("--out={}", tar.display()))
                    .args(&args),
                "oci-image.py",
            )?;
            self.import_archive(&tar)?;
            names.push(name);
        }
        Ok(names)
    }

    /// What to record to stop a detached node later ([`stop_detached`]).
    pub fn detach(mut self) -> DetachedNode {
        let procs = std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        self.released = true;
        DetachedNode {
            dir: self.dir.clone(),
            processes: procs
                .iter()
                .map(|p| crate::ProcessInfo {
                    name: p.name.to_string(),
                    pid: p.child.id(),
                    start_time: process::start_time(p.child.id()),
                })
                .collect(),
        }
    }

    fn shutdown(&mut self) {
        if self.released {
            return;
        }
        // The kubelet first (it would restart what is stopped), then every
        // pod through the CRI, then containerd and the rest.
        self.kill_component("kubelet");
        let _ = self.stop_all_pods();
        if let Ok(out) = self.crictl(&["pods", "-q"]) {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.crictl(&["rmp", "-f", id]);
            }
        }
        let mut procs = std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        process::terminate_children(&mut procs, Duration::from_secs(5));
        if let Some(stop) = &self.forward_stop {
            stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect_timeout(
                &SocketAddr::from((KUBERNETES_SERVICE_IP, 443)),
                Duration::from_millis(200),
            );
        }
        cleanup_host(&self.dir);
        if std::env::var("LOCK_JANITOR_TESTENV_KEEP").is_ok_and(|v| v == "1") {
            eprintln!(
                "testenv: keeping {} (LOCK_JANITOR_TESTENV_KEEP=1)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Stops a node that `testenv up --node` left running: kubelet, pods,
/// containerd, the forwarder; unmounts and removes its dir.
pub fn stop_detached(node: &DetachedNode) -> Result<(), String> {
    let live: Vec<&crate::ProcessInfo> = node
        .processes
        .iter()
        .filter(|p| crate::pid_alive(p.pid))
        .filter(|p| p.start_time.is_none() || crate::start_time(p.pid) == p.start_time)
        .collect();
    let pid = |name: &str| live.iter().find(|p| p.name == name).map(|p| p.pid);
    if let Some(k) = pid("kubelet") {
        crate::terminate_pids(&[k], Duration::from_secs(5));
    }
    let bin = crate::bin_dir();
    let sock = node.dir.join("containerd/containerd.sock");
    let ep = format!("unix://{}", sock.display());
    let conf = node.dir.join("crictl.yaml");
    let crictl = |args: &[&str]| {
        Command::new(bin.join("crictl"))
            .arg("--config")
            .arg(&conf)
            .args(["--runtime-endpoint", &ep, "--timeout=10s"])
            .args(args)
            .output()
    };
    if let Ok(out) = crictl(&["pods", "-q"]) {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = crictl(&["stopp", id]);
            let _ = crictl(&["rmp", "-f", id]);
        }
    }
    let mut stuck = Vec::new();
    for p in live.iter().rev() {
        if !crate::terminate_pids(&[p.pid], Duration::from_secs(5)).is_empty() {
            stuck.push(format!("{} (pid {})", p.name, p.pid));
        }
    }
    cleanup_host(&node.dir);
    if !stuck.is_empty() {
        return Err(format!("could not stop {}", stuck.join(", ")));
    }
    if node.dir.exists() {
        std::fs::remove_dir_all(&node.dir)
            .map_err(|e| format!("removing {}: {e}", node.dir.display()))?;
    }
    Ok(())
}

/// Serves the `kubernetes` Service for `testenv up --node`: forwards TCP
/// connections on `listen` to `target` until killed.
pub fn run_forwarder(listen: SocketAddr, target: SocketAddr) -> io::Result<()> {
    let l = TcpListener::bind(listen)?;
    serve_forward(l, target, Arc::new(AtomicBool::new(false)));
    Ok(())
}

fn serve_forward(l: TcpListener, target: SocketAddr, stop: Arc<AtomicBool>) {
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else { continue };
        std::thread::spawn(move || {
            let Ok(server) = TcpStream::connect(target) else {
                return;
            };
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            let up = std::thread::spawn(move || pipe(client, server));
            pipe(s2, c2);
            let _ = up.join();
        });
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// What the node needs of the host; an error naming what is missing.
fn host_checks() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Other(
            "the real node runs containerd and the kubelet: it needs root".into(),
        ));
    }
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        if !Path::new("/sys/fs/cgroup")
            .join(c)
            .join("cgroup.procs")
            .exists()
            && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        {
            return Err(Error::Other(format!(
                "cgroup controller {c} is not mounted at /sys/fs/cgroup/{c}"
            )));
        }
    }
    Ok(())
}

/// Puts the `kubernetes` Service IP on the loopback device (once).
fn add_service_ip() -> Result<(), Error> {
    let ip = format!("{KUBERNETES_SERVICE_IP}/32");
    let out = Command::new("ip")
        .args(["-4", "addr", "show", "dev", "lo"])
        .output()
        .map_err(io_err("running ip (iproute2)"))?;
    if String::from_utf8_lossy(&out.stdout).contains(&format!("inet {ip}")) {
        return Ok(());
    }
    run_ok(
        Command::new("ip").args(["addr", "add", &ip, "dev", "lo", "label", "lo:lj"]),
        "ip addr add",
    )?;
    Ok(())
}

/// Unmounts what containerd and the kubelet left under `dir`, and removes
/// the Service IP and the CNI bridge.
fn cleanup_host(dir: &Path) {
    let Ok(canon) = std::fs::canonicalize(dir) else {
        return;
    };
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        let mut points: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mount)
            .filter(|p| Path::new(p).starts_with(&canon))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            if let Ok(c) = std::ffi::CString::new(p) {
                // SAFETY: a valid C string; MNT_DETACH has no other preconditions.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
    let _ = Command::new("ip")
        .args([
            "addr",
            "del",
            &format!("{KUBERNETES_SERVICE_IP}/32"),
            "dev",
            "lo",
        ])
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("ip")
        .args(["link", "del", BRIDGE])
        .stderr(Stdio::null())
        .status();
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Removes node dirs of dead test processes (their mounts first).
fn reap_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || crate::pid_alive(pid) {
            continue;
        }
        // A detached node's dir belongs to `testenv up` (pid gone, node alive):
        // leave it when its containerd still runs.
        if std::fs::read_to_string(e.path().join("detached")).is_ok() {
            continue;
        }
        kill_left_behind(&e.path());
        cleanup_host(&e.path());
        let _ = std::fs::remove_dir_all(e.path());
    }
}

/// Kills what a node killed without its shutdown left running: containerd
/// and the kubelet die with the test (their death signal), but each pod's
/// shim (started with its containerd's address, under `dir`) and the
/// pod's processes under it do not.
fn kill_left_behind(dir: &Path) {
    let Some(dir) = dir.to_str().map(|d| format!("{d}/")) else {
        return;
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    // (pid, parent) of every process, and the shims of this dir.
    let mut parents = Vec::new();
    let mut doomed = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) = process::parent(pid) {
            parents.push((pid, ppid));
        }
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&dir) {
            doomed.push(pid);
        }
    }
    // With their descendants, found before any dies (an orphan is reparented).
    let mut i = 0;
    while i < doomed.len() {
        let parent = doomed[i];
        doomed.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    for pid in doomed {
        // SAFETY: plain kill(2) of a pid > 0.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

fn run_ok(cmd: &mut Command, what: &str) -> Result<Output, Error> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {what}")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(Error::Other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        )))
    }
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    )
}

fn free_port() -> Result<u16, Error> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_err("binding 127.0.0.1:0"))?;
    Ok(l.local_addr().map(|a| a.port()).unwrap_or(0))
}

fn server_of(kubeconfig: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(kubeconfig)
        .map_err(io_err(format!("reading {}", kubeconfig.display())))?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("server:")
                .map(|s| s.trim().to_string())
        })
        .ok_or_else(|| Error::Other(format!("no server in {}", kubeconfig.display())))
}

fn token_kubeconfig(server: &str, ca: &str, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: lock-janitor-testenv
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: lock-janitor-testenv
  context:
    cluster: lock-janitor-testenv
    user: {user}
current-context: lock-janitor-testenv
",
        ca = crate::certs::base64(ca.as_bytes()),
    )
}

/// The testenv/ directory of the source tree (for peers/ and node/).
fn testenv_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The peers binary built static (CGO_ENABLED=0) for the image, cached by
/// the sources' hash in the bin dir.
fn static_peers(images: &Path) -> Result<PathBuf, Error> {
    let src = testenv_dir().join("peers");
    let out = crate::bin_dir().join("peers-static");
    let stamp = crate::bin_dir().join("peers-static.sum");
    // Rebuilt when build.sh's peers (same sources) changed: its peers.sum.
    let sum = std::fs::read_to_string(crate::bin_dir().join("peers.sum")).unwrap_or_default();
    if !out.exists() || std::fs::read_to_string(&stamp).unwrap_or_default() != sum {
        let tmp = images.join("peers-static");
        run_ok(
            Command::new("go")
                .current_dir(&src)
                .env("CGO_ENABLED", "0")
                .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
                .arg(&tmp)
                .arg("."),
            "go build (static peers)",
        )?;
        std::fs::rename(&tmp, &out).map_err(io_err("caching peers-static"))?;
        let _ = std::fs::write(&stamp, sum);
    }
    Ok(out)
}

/// The memory hog (node/hog.c), static.
fn static_hog(images: &Path) -> Result<PathBuf, Error> {
    let out = images.join("hog");
    run_ok(
        Command::new("gcc")
            .args(["-Os", "-static", "-o"])
            .arg(&out)
            .arg(testenv_dir().join("node/hog.c")),
        "gcc (hog)",
    )?;
    Ok(out)
}
