//! A real local Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager, started as child processes from the binaries that
//! `testenv/build.sh` (`make testenv-build`) puts in [`bin_dir`].
//!
//! ```no_run
//! # async fn t() {
//! let cp = lock_janitor_testenv::shared().await;         // one per test binary
//! let client = cp.client().await.unwrap();                // admin (system:masters)
//! let ns = lock_janitor_testenv::fresh_namespace(&client, "my-test").await;
//! # }
//! ```
//!
//! There is no kubelet and no scheduler: tests play the kubelet with
//! [`kubelet`]. The apiserver writes an audit log ([`audit`]).
//!
//! Environment:
//! - `LOCK_JANITOR_TESTENV_BIN`: directory with the binaries (default: [`bin_dir`]).
//! - `LOCK_JANITOR_TESTENV_TIMEOUT`: seconds to wait for each component (default 60).
//! - `LOCK_JANITOR_TESTENV_KEEP=1`: keep the temp dir (logs, certs, data) on stop.
//!
//! Child processes are spawned from one long-lived thread with
//! `PR_SET_PDEATHSIG=SIGKILL`, so they die with the test process even when it
//! is killed; temp dirs of dead test processes are removed at the next start.

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

pub mod audit;
mod certs;
pub mod elector;
pub mod kubelet;
pub mod node;
mod paths;
pub mod peers;
mod process;

pub use certs::{ADMIN_GROUP, ADMIN_USER, CONTROLLER_MANAGER_USER, KUBERNETES_SERVICE_IP};
pub use paths::{bin_dir, binary, cache_root, Versions};
pub use process::{pid_alive, start_time, terminate_pids};

use process::Proc;

/// How a component was started: program, arguments, mode.
type Launch = (std::ffi::OsString, Vec<std::ffi::OsString>, Mode);

/// What to run in the control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run the ownerReference garbage collector (default true).
    pub garbage_collector: bool,
    /// Run the node-lifecycle and taint-eviction controllers, with a 10 s
    /// node-monitor grace period (default false).
    pub node_lifecycle: bool,
    /// Appended to the kube-apiserver command line.
    pub extra_apiserver_args: Vec<String>,
    /// Appended to the kube-controller-manager command line.
    pub extra_controller_manager_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            garbage_collector: true,
            node_lifecycle: false,
            extra_apiserver_args: Vec::new(),
            extra_controller_manager_args: Vec::new(),
        }
    }
}

/// Why the control plane could not start (or a client could not be built).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("testenv: {name} not found at {}: run `make testenv-build` (testenv/build.sh) to build the control-plane binaries, or point LOCK_JANITOR_TESTENV_BIN at a directory that has them", path.display())]
    MissingBinary { name: String, path: PathBuf },
    #[error("testenv: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("testenv: generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("testenv: {component} exited during start-up ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        component: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("testenv: {component} could not listen on 127.0.0.1:{port}: address already in use (gave up after {attempts} attempts with fresh ports); last lines of {}:\n{tail}", log.display())]
    PortInUse {
        component: &'static str,
        port: u16,
        attempts: u32,
        log: PathBuf,
        tail: String,
    },
    #[error("testenv: {component} was not ready after {secs}s (last check: {last}); last lines of {}:\n{tail}", log.display())]
    Timeout {
        component: &'static str,
        secs: u64,
        last: String,
        log: PathBuf,
        tail: String,
    },
    #[error("testenv: building a client: {0}")]
    Client(#[from] kube::Error),
    #[error("testenv: {0}")]
    Other(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Ports of one control plane (all on 127.0.0.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    pub controller_manager: u16,
}

/// A process of a detached control plane (see [`ControlPlane::detach`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: u32,
    /// From /proc/<pid>/stat, to avoid signalling a reused pid.
    pub start_time: Option<u64>,
}

/// What is left of a control plane after [`ControlPlane::detach`]: enough to
/// use it and to stop it later (`testenv down`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Detached {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server_url: String,
    pub audit_log: PathBuf,
    pub ports: Ports,
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Children die with this process (tests).
    Tied,
    /// Children outlive this process (`testenv up`).
    Detached,
}

const DIR_PREFIX: &str = "lock-janitor-testenv-";
static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);
const START_ATTEMPTS: u32 = 3;

/// A running control plane. Stopped (processes killed, temp dir removed) by
/// [`ControlPlane::stop`] or on drop.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    audit_log: PathBuf,
    server_url: String,
    ca_der: Vec<u8>,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    ports: Ports,
    procs: Mutex<Vec<Proc>>,
    /// How etcd and kube-apiserver were started (program, arguments, mode),
    /// to start them again after a fault.
    commands: Mutex<Vec<(&'static str, Launch)>>,
    /// Set by detach(): leave processes and dir alone on drop.
    released: bool,
    /// Set when start-up failed: keep the logs the error names.
    keep_dir: bool,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager and waits until
    /// they serve (apiserver /readyz incl. RBAC bootstrap, controller-manager
    /// /healthz and the `default` ServiceAccount in `default`). Retries with
    /// fresh ports if one was taken meanwhile.
    pub async fn start(opts: Options) -> Result<ControlPlane, Error> {
        Self::launch(opts, Mode::Tied).await
    }

    /// Like [`start`](Self::start), but the processes run in their own session
    /// and survive this process; call [`detach`](Self::detach) to keep them.
    pub async fn start_detached(opts: Options) -> Result<ControlPlane, Error> {
        Self::launch(opts, Mode::Detached).await
    }

    async fn launch(opts: Options, mode: Mode) -> Result<ControlPlane, Error> {
        let bins = [
            binary("etcd")?,
            binary("kube-apiserver")?,
            binary("kube-controller-manager")?,
        ];
        reap_stale_dirs();
        let mut attempt = 1;
        loop {
            match Self::try_launch(&opts, mode, &bins).await {
                Err(Error::PortInUse {
                    component,
                    port,
                    log,
                    ..
                }) if attempt < START_ATTEMPTS => {
                    tracing::warn!(component, port, log = %log.display(), "testenv: port taken, retrying with fresh ports");
                    attempt += 1;
                }
                Err(Error::PortInUse {
                    component,
                    port,
                    log,
                    tail,
                    ..
                }) => {
                    return Err(Error::PortInUse {
                        component,
                        port,
                        attempts: attempt,
                        log,
                        tail,
                    })
                }
                other => return other,
            }
        }
    }

    async fn try_launch(
        opts: &Options,
        mode: Mode,
        bins: &[PathBuf; 3],
    ) -> Result<ControlPlane, Error> {
        let started = Instant::now();
        let dir = make_dir(mode)?;
        let pki_dir = dir.join("pki");
        let ports = free_ports()?;
        // From here on, dropping `cp` kills what was started.
        let mut cp = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            audit_log: dir.join("audit.log"),
            server_url: format!("https://127.0.0.1:{}", ports.apiserver),
            ca_der: Vec::new(),
            admin_cert: pki_dir.join("admin.crt"),
            admin_key: pki_dir.join("admin.key"),
            ports,
            procs: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            released: false,
            keep_dir: false,
            dir,
        };
        match cp.boot(opts, mode, bins, started).await {
            Ok(()) => Ok(cp),
            Err(e) => {
                // Processes are killed on drop; the dir (logs named in the
                // error) stays until a later start finds this process gone.
                cp.keep_dir = true;
                Err(e)
            }
        }
    }

    async fn boot(
        &mut self,
        opts: &Options,
        mode: Mode,
        [etcd, apiserver, kcm]: &[PathBuf; 3],
        started: Instant,
    ) -> Result<(), Error> {
        // Certificates, kubeconfig, audit policy.
        let policy = self.write_files()?;
        let etcd_client = self.start_etcd(etcd, mode).await?;
        let etcd_at = started.elapsed();
        let admin = self
            .start_apiserver(apiserver, opts, mode, &etcd_client, &policy)
            .await?;
        let apiserver_at = started.elapsed();
        self.start_controller_manager(kcm, opts, mode, admin)
            .await?;
        tracing::info!(
            dir = %self.dir.display(),
            server = %self.server_url,
            etcd_ms = etcd_at.as_millis() as u64,
            apiserver_ms = apiserver_at.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "testenv: control plane ready"
        );
        Ok(())
    }

    /// The certificates, the admin's and the controller manager's
    /// kubeconfigs and the audit policy, in the state dir; returns the
    /// policy's path.
    fn write_files(&mut self) -> Result<PathBuf, Error> {
        let pki_dir = self.dir.join("pki");
        let dir = self.dir.clone();
        std::fs::create_dir_all(&pki_dir)
            .map_err(io_err(format!("creating {}", pki_dir.display())))?;
        let pki = certs::generate()?;
        let p = |n: &str| pki_dir.join(n);
        for (name, content) in [
            ("ca.crt", &pki.ca_cert),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("admin.crt", &pki.admin_cert),
            ("admin.key", &pki.admin_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_pub),
        ] {
            write_private(&p(name), content)?;
        }
        self.ca_der = pki.ca_der.clone();
        write_private(
            &self.kubeconfig,
            &kubeconfig_yaml(
                &self.server_url,
                &pki.ca_cert,
                ADMIN_USER,
                &pki.admin_cert,
                &pki.admin_key,
            ),
        )?;
        // The controller manager gets its own user (still system:masters, as
        // --use-service-account-credentials=false needs broad rights), so the
        // audit log tells its writes (e.g. GC deletes) from the tests'.
        write_private(
            &dir.join("controller-manager.kubeconfig"),
            &kubeconfig_yaml(
                &self.server_url,
                &pki.ca_cert,
                CONTROLLER_MANAGER_USER,
                &pki.kcm_cert,
                &pki.kcm_key,
            ),
        )?;
        let policy = dir.join("audit-policy.yaml");
        write_private(&policy, audit::POLICY)?;
        Ok(policy)
    }

    /// Starts etcd and waits until it serves; returns its client URL.
    async fn start_etcd(&self, etcd: &Path, mode: Mode) -> Result<String, Error> {
        let ports = self.ports;
        let dir = self.dir.clone();
        let s = |p: &Path| p.display().to_string();
        let etcd_client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let etcd_peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let mut cmd = Command::new(etcd);
        cmd.arg(format!("--data-dir={}", s(&dir.join("etcd-data"))))
            .arg("--name=default")
            .arg(format!("--listen-client-urls={etcd_client}"))
            .arg(format!("--advertise-client-urls={etcd_client}"))
            .arg(format!("--listen-peer-urls={etcd_peer}"))
            .arg(format!("--initial-advertise-peer-urls={etcd_peer}"))
            .arg(format!("--initial-cluster=default={etcd_peer}"))
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        self.remember("etcd", &cmd, mode);
        self.spawn("etcd", cmd, mode)?;
        let etcd_port = ports.etcd_client;
        self.wait_ready("etcd", &[ports.etcd_client, ports.etcd_peer], || {
            probe_etcd(etcd_port)
        })
        .await?;
        Ok(etcd_client)
    }

    /// Starts kube-apiserver on etcd and waits until it serves; returns the
    /// admin client.
    async fn start_apiserver(
        &self,
        apiserver: &Path,
        opts: &Options,
        mode: Mode,
        etcd_client: &str,
        policy: &Path,
    ) -> Result<kube::Client, Error> {
        let ports = self.ports;
        let dir = self.dir.clone();
        let pki_dir = self.dir.join("pki");
        let p = |n: &str| pki_dir.join(n);
        let s = |p: &Path| p.display().to_string();
        let mut cmd = Command::new(apiserver);
        cmd.arg(format!("--etcd-servers={etcd_client}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", ports.apiserver))
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--cert-dir={}", s(&dir.join("apiserver-certs"))))
            .arg(format!("--tls-cert-file={}", s(&p("apiserver.crt"))))
            .arg(format!("--tls-private-key-file={}", s(&p("apiserver.key"))))
            .arg(format!("--client-ca-file={}", s(&p("ca.crt"))))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", s(&p("sa.pub"))))
            .arg(format!(
                "--service-account-signing-key-file={}",
                s(&p("sa.key"))
            ))
            .arg(format!("--audit-log-path={}", s(&self.audit_log)))
            .arg(format!("--audit-policy-file={}", s(policy)))
            .arg("--audit-log-format=json")
            .arg("--audit-log-mode=blocking")
            // The `kubernetes` Service endpoints would be 127.0.0.1, which
            // Endpoints validation rejects; nothing here needs them.
            .arg("--endpoint-reconciler-type=none")
            // Leases with spec.strategy and spec.preferredHolder (Coordinated
            // Leader Election) exist only with this gate on; the janitor must
            // see them as such and never write them.
            // The gate's controller watches LeaseCandidates, whose API
            // version depends on the minor (readyz waits for its informer).
            // On 1.34-1.35 MutatingAdmissionPolicy is a beta that is off by
            // default (its gate and its API version both), as the chart's
            // autoOptIn.allowV1beta1 expects a cluster to enable it.
            .args(minor_flags(server_minor(apiserver)))
            .args(&opts.extra_apiserver_args);
        self.remember("kube-apiserver", &cmd, mode);
        self.spawn("kube-apiserver", cmd, mode)?;
        let admin = self.client().await?;
        self.wait_ready("kube-apiserver", &[ports.apiserver], || {
            probe_apiserver(admin.clone())
        })
        .await?;
        Ok(admin)
    }

    /// Starts kube-controller-manager with the controllers the options ask
    /// for and waits until it serves.
    async fn start_controller_manager(
        &self,
        kcm: &Path,
        opts: &Options,
        mode: Mode,
        admin: kube::Client,
    ) -> Result<(), Error> {
        let ports = self.ports;
        let dir = self.dir.clone();
        let pki_dir = self.dir.join("pki");
        let p = |n: &str| pki_dir.join(n);
        let s = |p: &Path| p.display().to_string();
        let mut controllers = vec![
            "pod-garbage-collector-controller",
            "replicaset-controller",
            "serviceaccount-controller",
            "serviceaccount-token-controller",
            "namespace-controller",
        ];
        if opts.garbage_collector {
            controllers.push("garbage-collector-controller");
        }
        if opts.node_lifecycle {
            controllers.extend(["node-lifecycle-controller", "taint-eviction-controller"]);
        }
        let kc = s(&dir.join("controller-manager.kubeconfig"));
        let mut cmd = Command::new(kcm);
        cmd.arg(format!("--kubeconfig={kc}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", ports.controller_manager))
            .arg(format!("--tls-cert-file={}", s(&p("apiserver.crt"))))
            .arg(format!("--tls-private-key-file={}", s(&p("apiserver.key"))))
            .arg("--leader-elect=false")
            .arg("--use-service-account-credentials=false")
            .arg(format!("--controllers={}", controllers.join(",")))
            .arg(format!(
                "--service-account-private-key-file={}",
                s(&p("sa.key"))
            ))
            .arg(format!("--root-ca-file={}", s(&p("ca.crt"))));
        if !opts.garbage_collector {
            cmd.arg("--enable-garbage-collector=false");
        }
        if opts.node_lifecycle {
            cmd.arg("--node-monitor-grace-period=10s")
                .arg("--node-monitor-period=1s")
                .arg("--node-startup-grace-period=10s");
        }
        cmd.args(&opts.extra_controller_manager_args);
        self.spawn("kube-controller-manager", cmd, mode)?;
        let mut kcm_config = kube::Config::new(
            format!("https://127.0.0.1:{}", ports.controller_manager)
                .parse()
                .expect("valid url"),
        );
        kcm_config.root_cert = Some(vec![self.ca_der.clone()]);
        let kcm_client = kube::Client::try_from(kcm_config)?;
        self.wait_ready(
            "kube-controller-manager",
            &[ports.controller_manager],
            || probe_controller_manager(kcm_client.clone(), admin.clone()),
        )
        .await?;
        Ok(())
    }

    fn remember(&self, name: &'static str, cmd: &Command, mode: Mode) {
        let launch = (
            cmd.get_program().to_owned(),
            cmd.get_args().map(|a| a.to_owned()).collect(),
            mode,
        );
        let mut commands = self.commands.lock().unwrap_or_else(|e| e.into_inner());
        commands.retain(|(n, _)| *n != name);
        commands.push((name, launch));
    }

    /// Kills kube-apiserver (SIGKILL: open watches break, as in a crash) and
    /// starts it again with the same flags and port; returns once it serves.
    /// Its earlier log is kept as `kube-apiserver.<n>.log`.
    pub async fn restart_apiserver(&self) -> Result<(), Error> {
        self.restart("kube-apiserver").await
    }

    /// Kills etcd (SIGKILL) and starts it again on the same data and ports;
    /// returns once etcd serves and the apiserver is ready again.
    pub async fn restart_etcd(&self) -> Result<(), Error> {
        self.restart("etcd").await?;
        let admin = self.client().await?;
        self.wait_ready("kube-apiserver", &[self.ports.apiserver], || {
            probe_apiserver(admin.clone())
        })
        .await
    }

    /// Stops a component with SIGSTOP (a hung process: connections stay
    /// open, nothing answers) until [`resume`](Self::resume).
    pub fn pause(&self, component: &str) -> Result<(), Error> {
        self.send(component, libc::SIGSTOP)
    }

    /// Continues a component stopped by [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self, component: &str) -> Result<(), Error> {
        self.send(component, libc::SIGCONT)
    }

    fn send(&self, component: &str, sig: libc::c_int) -> Result<(), Error> {
        let pid = self
            .processes()
            .into_iter()
            .find(|(n, _)| *n == component)
            .map(|(_, pid)| pid)
            .ok_or_else(|| Error::Other(format!("{component} is not running")))?;
        process::signal(pid, sig);
        Ok(())
    }

    async fn restart(&self, component: &'static str) -> Result<(), Error> {
        let launch = self
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| *n == component)
            .map(|(_, l)| l.clone());
        let Some((program, args, mode)) = launch else {
            return Err(Error::Io {
                what: format!("restarting {component}"),
                source: std::io::Error::other("it was never started"),
            });
        };
        let old = {
            let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            let at = procs.iter().position(|p| p.name == component);
            at.map(|i| procs.remove(i))
        };
        if let Some(mut p) = old {
            // A paused process dies of SIGKILL too.
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        let log = self.log_path(component);
        let n = (1..)
            .find(|n| !self.dir.join(format!("{component}.{n}.log")).exists())
            .unwrap_or(1);
        let _ = std::fs::rename(&log, self.dir.join(format!("{component}.{n}.log")));
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.spawn(component, cmd, mode)?;
        match component {
            "etcd" => {
                let port = self.ports.etcd_client;
                self.wait_ready(
                    "etcd",
                    &[self.ports.etcd_client, self.ports.etcd_peer],
                    || probe_etcd(port),
                )
                .await
            }
            _ => {
                let admin = self.client().await?;
                self.wait_ready(component, &[self.ports.apiserver], || {
                    probe_apiserver(admin.clone())
                })
                .await
            }
        }
    }

    fn spawn(&self, name: &'static str, mut cmd: Command, mode: Mode) -> Result<(), Error> {
        let log = self.log_path(name);
        let out =
            std::fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err("duplicating a log file handle"))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(&self.dir);
        let child = match mode {
            Mode::Tied => process::spawn_tied(cmd),
            Mode::Detached => process::spawn_detached(cmd),
        }
        .map_err(io_err(format!("starting {name}")))?;
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Proc { name, child });
        Ok(())
    }

    fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    /// Polls `probe` until it succeeds, the component exits, or the timeout.
    async fn wait_ready<F, Fut>(
        &self,
        component: &'static str,
        ports: &[u16],
        mut probe: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let timeout = component_timeout();
        let start = Instant::now();
        let log = self.log_path(component);
        let mut last;
        loop {
            if let Some(status) = self.exit_status(component) {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail = tail(&text, 30);
                if let Some(port) = port_in_use(&text, ports) {
                    return Err(Error::PortInUse {
                        component,
                        port,
                        attempts: 1,
                        log,
                        tail,
                    });
                }
                return Err(Error::Exited {
                    component,
                    status,
                    log,
                    tail,
                });
            }
            match tokio::time::timeout(Duration::from_secs(5), probe()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e,
                Err(_) => last = "probe timed out after 5s".to_string(),
            }
            if start.elapsed() >= timeout {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(Error::Timeout {
                    component,
                    secs: timeout.as_secs(),
                    last,
                    log,
                    tail: tail(&text, 30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn exit_status(&self, component: &str) -> Option<String> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let p = procs.iter_mut().find(|p| p.name == component)?;
        match p.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("cannot wait for it: {e}")),
        }
    }

    /// The admin kubeconfig (`<dir>/kubeconfig`, CN=lock-janitor-admin, O=system:masters).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>` of kube-apiserver.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The apiserver's JSON-lines audit log; read it with [`audit::read`].
    pub fn audit_log_path(&self) -> &Path {
        &self.audit_log
    }

    /// The temp dir with certificates (`pki/`), logs (`<component>.log`) and etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ports in use.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// Name and pid of each running component.
    pub fn processes(&self) -> Vec<(&'static str, u32)> {
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| (p.name, p.child.id()))
            .collect()
    }

    /// The admin client configuration. Set `auth_info.impersonate` (and
    /// `impersonate_groups`) on it to act as someone else, e.g.
    /// `Some("system:serviceaccount:ns:sa".into())`.
    pub fn kube_config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.server_url.parse().expect("server url is valid"));
        config.root_cert = Some(vec![self.ca_der.clone()]);
        config.auth_info.client_certificate = Some(self.admin_cert.display().to_string());
        config.auth_info.client_key = Some(self.admin_key.display().to_string());
        config
    }

    /// A new admin client. A `kube::Client` is bound to the tokio runtime that
    /// created it, so this builds a fresh one on every call.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(self.kube_config())?)
    }

    /// Stops the processes (SIGTERM, SIGKILL after a few seconds), waits for
    /// them and removes the temp dir (unless `LOCK_JANITOR_TESTENV_KEEP=1`).
    pub fn stop(self) {
        // Drop does the work.
    }

    fn shutdown(&self) {
        if self.released {
            return;
        }
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        process::terminate_children(&mut procs, Duration::from_secs(5));
        procs.clear();
        if self.keep_dir {
            // Start-up failed; the reaper removes it once this process is gone.
        } else if std::env::var("LOCK_JANITOR_TESTENV_KEEP").is_ok_and(|v| v == "1") {
            eprintln!(
                "testenv: keeping {} (LOCK_JANITOR_TESTENV_KEEP=1)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Lets the processes run on after this value is gone (for `testenv up`;
    /// only meaningful after [`start_detached`](Self::start_detached)).
    pub fn detach(mut self) -> Detached {
        let procs = std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        self.released = true;
        Detached {
            dir: self.dir.clone(),
            kubeconfig: self.kubeconfig.clone(),
            server_url: self.server_url.clone(),
            audit_log: self.audit_log.clone(),
            ports: self.ports,
            processes: procs
                .iter()
                .map(|p| ProcessInfo {
                    name: p.name.to_string(),
                    pid: p.child.id(),
                    start_time: process::start_time(p.child.id()),
                })
                .collect(),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The minor of a kube-apiserver binary (`--version` prints `Kubernetes
/// v1.31.14`), asked once per path; `None` if it does not say.
fn server_minor(apiserver: &Path) -> Option<u32> {
    static MINORS: Mutex<Vec<(PathBuf, Option<u32>)>> = Mutex::new(Vec::new());
    let mut minors = MINORS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = minors.iter().find(|(p, _)| p == apiserver) {
        return *m;
    }
    let out = Command::new(apiserver)
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    let minor = out
        .ok()
        .and_then(|o| parse_minor(&String::from_utf8_lossy(&o.stdout)));
    minors.push((apiserver.to_path_buf(), minor));
    minor
}

/// `Kubernetes v1.31.14` -> 31.
fn parse_minor(version: &str) -> Option<u32> {
    let v = version.split_whitespace().last()?.strip_prefix("v1.")?;
    v.split(['.', '-', '+']).next()?.parse().ok()
}

/// The group version of the LeaseCandidates the CoordinatedLeaderElection
/// controller watches: v1alpha1 in 1.31, v1alpha2 in 1.32, v1beta1 since 1.33
/// (k8s.io/kubernetes pkg/controlplane/apiserver/server.go at each tag).
fn lease_candidate_api(minor: Option<u32>) -> &'static str {
    match minor {
        Some(31) => "coordination.k8s.io/v1alpha1",
        Some(32) => "coordination.k8s.io/v1alpha2",
        _ => "coordination.k8s.io/v1beta1",
    }
}

/// Whether this minor serves MutatingAdmissionPolicy only as a beta that is
/// off by default: 1.34 and 1.35 (gate `MutatingAdmissionPolicy` beta,
/// default false; `admissionregistration.k8s.io/v1beta1` in
/// betaAPIGroupVersionsDisabledByDefault: k8s.io/kubernetes
/// pkg/features/kube_features.go and pkg/controlplane/instance.go at
/// v1.34.4 and v1.35.4). 1.31-1.33 have it alpha at most; 1.36 made it GA (v1,
/// on by default).
fn mutating_admission_policy_beta(minor: Option<u32>) -> bool {
    matches!(minor, Some(34 | 35))
}

/// The kube-apiserver's minor-dependent flags: `--feature-gates` and
/// `--runtime-config`, one of each.
fn minor_flags(minor: Option<u32>) -> [String; 2] {
    let mut gates = vec!["CoordinatedLeaderElection=true"];
    let mut apis = vec![lease_candidate_api(minor)];
    if mutating_admission_policy_beta(minor) {
        gates.push("MutatingAdmissionPolicy=true");
        apis.push("admissionregistration.k8s.io/v1beta1");
    }
    let apis: Vec<String> = apis.iter().map(|a| format!("{a}=true")).collect();
    [
        format!("--feature-gates={}", gates.join(",")),
        format!("--runtime-config={}", apis.join(",")),
    ]
}

fn component_timeout() -> Duration {
    let secs = std::env::var("LOCK_JANITOR_TESTENV_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The port among `ports` that the log says was already in use.
fn port_in_use(log: &str, ports: &[u16]) -> Option<u16> {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("address already in use"))
        .collect();
    if lines.is_empty() {
        return None;
    }
    ports
        .iter()
        .copied()
        .find(|p| lines.iter().any(|l| l.contains(&format!(":{p}"))))
        .or(ports.first().copied())
}

fn write_private(path: &Path, content: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(format!("writing {}", path.display())))?;
    f.write_all(content.as_bytes())
        .map_err(io_err(format!("writing {}", path.display())))
}

fn make_dir(mode: Mode) -> Result<PathBuf, Error> {
    use std::os::unix::fs::DirBuilderExt;
    let pid = std::process::id();
    // Detached dirs outlive this pid: a name the reaper does not parse.
    let kind = if mode == Mode::Detached { "up-" } else { "" };
    loop {
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{kind}{pid}-{n}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
        }
    }
}

/// Where `testenv up` records the control plane it started (outliving it).
pub fn up_state_path() -> PathBuf {
    cache_root().join("testenv").join("run").join("state.json")
}

/// Working directories of all processes we can see. Components run with
/// their control plane's dir as working directory, so a dir in this set is
/// in use whoever started it (whatever its cache/env settings).
fn dirs_in_use() -> std::collections::HashSet<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    procs
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_link(e.path().join("cwd")).ok())
        .collect()
}

/// Removes temp dirs left behind by interrupted runs:
/// `lock-janitor-testenv-<pid>-<n>` whose process is gone, and
/// `lock-janitor-testenv-up-<pid>-<n>` whose `testenv up` is gone and that
/// [`up_state_path`] does not name (a failed `up`); never a dir that a
/// running process uses as its working directory.
fn reap_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let me = std::process::id();
    let mut up_dir: Option<Option<PathBuf>> = None;
    let mut in_use: Option<std::collections::HashSet<PathBuf>> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let (detached, rest) = match rest.strip_prefix("up-") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || pid_alive(pid) {
            continue;
        }
        if detached {
            let running = up_dir.get_or_insert_with(|| {
                let text = std::fs::read_to_string(up_state_path()).ok()?;
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                v.get("dir")?.as_str().map(PathBuf::from)
            });
            if running.as_deref() == Some(entry.path().as_path()) {
                continue;
            }
        }
        let path = entry.path();
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if in_use.get_or_insert_with(dirs_in_use).contains(&canonical) {
            continue;
        }
        tracing::info!(dir = %entry.path().display(), "testenv: removing stale dir");
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

fn free_ports() -> Result<Ports, Error> {
    // Hold all listeners at once so the four ports differ.
    let ls = (0..4)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err("binding 127.0.0.1:0 to pick a free port"))?;
    let port = |i: usize| ls[i].local_addr().map(|a| a.port()).unwrap_or(0);
    Ok(Ports {
        etcd_client: port(0),
        etcd_peer: port(1),
        apiserver: port(2),
        controller_manager: port(3),
    })
}

fn kubeconfig_yaml(server: &str, ca: &str, user: &str, cert: &str, key: &str) -> String {
    let b = |s: &str| certs::base64(s.as_bytes());
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
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: lock-janitor-testenv
  context:
    cluster: lock-janitor-testenv
    user: {user}
    namespace: default
current-context: lock-janitor-testenv
preferences: {{}}
",
        ca = b(ca),
        cert = b(cert),
        key = b(key),
    )
}

async fn probe_etcd(port: u16) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    if text.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(format!(
            "GET /health: {}",
            text.lines().last().unwrap_or("")
        ))
    }
}

async fn get_text(client: &kube::Client, path: &str) -> Result<String, String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(req)
        .await
        .map_err(|e| format!("GET {path}: {e}"))
}

async fn probe_apiserver(admin: kube::Client) -> Result<(), String> {
    get_text(&admin, "/readyz").await?;
    Api::<ClusterRole>::all(admin.clone())
        .get("cluster-admin")
        .await
        .map_err(|e| format!("get clusterrole cluster-admin: {e}"))?;
    Api::<Namespace>::all(admin)
        .get("default")
        .await
        .map_err(|e| format!("get namespace default: {e}"))?;
    Ok(())
}

async fn probe_controller_manager(kcm: kube::Client, admin: kube::Client) -> Result<(), String> {
    get_text(&kcm, "/healthz").await?;
    match Api::<ServiceAccount>::namespaced(admin, "default")
        .get_opt("default")
        .await
    {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("serviceaccount default/default not created yet".to_string()),
        Err(e) => Err(format!("get serviceaccount default/default: {e}")),
    }
}

static SHARED: tokio::sync::OnceCell<Result<ControlPlane, String>> =
    tokio::sync::OnceCell::const_new();

/// The control plane shared by all tests of this test binary: started once
/// (default [`Options`]) by the first caller, from any tokio runtime. Panics
/// with the start error. Stopped when the process exits.
pub async fn shared() -> &'static ControlPlane {
    let result = SHARED
        .get_or_init(|| async {
            let r = ControlPlane::start(Options::default())
                .await
                .map_err(|e| e.to_string());
            if r.is_ok() {
                // SAFETY: registers a plain extern "C" fn without arguments.
                unsafe {
                    libc::atexit(stop_shared_at_exit);
                }
            }
            r
        })
        .await;
    match result {
        Ok(cp) => cp,
        Err(e) => panic!("lock-janitor-testenv: the shared control plane did not start:\n{e}"),
    }
}

/// Statics are never dropped: stop the shared control plane when the test
/// binary exits normally (on a crash, PDEATHSIG kills the processes and the
/// next start removes the dir).
extern "C" fn stop_shared_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(cp)) = SHARED.get() {
            cp.shutdown();
        }
    });
}

fn random_suffix(len: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_usize(DIR_COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut n = h.finish();
    (0..len)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Creates a namespace `<prefix>-<random>` and waits until its `default`
/// ServiceAccount exists (pods cannot be created before). Panics on failure.
pub async fn fresh_namespace(client: &kube::Client, prefix: &str) -> String {
    let mut base: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(50);
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    let name = format!("{base}-{}", random_suffix(6));
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/created-by".to_string(),
                    "lock-janitor-testenv".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("lock-janitor-testenv: creating namespace {name}: {e}"));
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match sas.get_opt("default").await {
            Ok(Some(_)) => return name,
            Ok(None) => {}
            Err(e) => panic!("lock-janitor-testenv: reading serviceaccount {name}/default: {e}"),
        }
        if Instant::now() > deadline {
            panic!("lock-janitor-testenv: serviceaccount {name}/default was not created within 60s (is the serviceaccount controller running?)");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_taken_port() {
        let log = "x\nE0101 listen tcp 127.0.0.1:4242: bind: address already in use\n";
        assert_eq!(port_in_use(log, &[1, 4242]), Some(4242));
        assert_eq!(port_in_use("all good", &[1]), None);
    }

    #[test]
    fn lease_candidate_api_by_minor() {
        assert_eq!(parse_minor("Kubernetes v1.31.14\n"), Some(31));
        assert_eq!(parse_minor("Kubernetes v1.37.2"), Some(37));
        assert_eq!(parse_minor("Kubernetes v0.0.0-master+$Format"), None);
        assert_eq!(
            lease_candidate_api(Some(31)),
            "coordination.k8s.io/v1alpha1"
        );
        assert_eq!(
            lease_candidate_api(Some(32)),
            "coordination.k8s.io/v1alpha2"
        );
        assert_eq!(lease_candidate_api(Some(33)), "coordination.k8s.io/v1beta1");
        assert_eq!(lease_candidate_api(None), "coordination.k8s.io/v1beta1");
    }

    #[test]
    fn mutating_admission_policy_beta_on_1_34_and_1_35_only() {
        assert_eq!(
            minor_flags(Some(31)),
            [
                "--feature-gates=CoordinatedLeaderElection=true".to_string(),
                "--runtime-config=coordination.k8s.io/v1alpha1=true".to_string(),
            ]
        );
        for m in [34, 35] {
            assert_eq!(
                minor_flags(Some(m)),
                [
                    "--feature-gates=CoordinatedLeaderElection=true,MutatingAdmissionPolicy=true"
                        .to_string(),
                    "--runtime-config=coordination.k8s.io/v1beta1=true,admissionregistration.k8s.io/v1beta1=true"
                        .to_string(),
                ]
            );
        }
        for m in [Some(33), Some(36), Some(37), None] {
            assert!(!mutating_admission_policy_beta(m), "{m:?}");
        }
    }

    #[test]
    fn suffix_is_dns_safe() {
        let s = random_suffix(6);
        assert_eq!(s.len(), 6);
        assert!(s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(random_suffix(6), random_suffix(6));
    }

    #[test]
    fn missing_binary_error_says_how_to_build() {
        let e = Error::MissingBinary {
            name: "etcd".into(),
            path: "/nope/etcd".into(),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("/nope/etcd")
                && msg.contains("make testenv-build")
                && msg.contains("testenv/build.sh"),
            "{msg}"
        );
    }
}
