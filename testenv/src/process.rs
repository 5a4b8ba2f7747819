//! Child processes of the control plane.
//!
//! Test mode: every child is spawned from ONE long-lived thread, in its own
//! process group, with `PR_SET_PDEATHSIG=SIGKILL`. The death signal fires when
//! the *thread* that forked the child exits, and test threads (and their tokio
//! runtimes) come and go, so a dedicated spawner thread that never exits is the
//! only safe parent. Nothing here depends on a tokio runtime.
//!
//! Detached mode (`testenv up`): children start a new session (`setsid`) and
//! outlive the command.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and the thread) never ends.
                for mut req in rx {
                    let _ = req.reply.send(req.cmd.spawn());
                }
            })
            .expect("lock-janitor-testenv: cannot start the spawner thread");
        tx
    })
}

/// Sends `cmd`'s stdout to `<base>.out` and its stderr to `<base>.log`,
/// both made anew; their paths.
pub(crate) fn output_to(
    cmd: &mut Command,
    base: &std::path::Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf), crate::Error> {
    let (out, log) = (base.with_extension("out"), base.with_extension("log"));
    let create = |p: &std::path::Path| {
        std::fs::File::create(p).map_err(|e| crate::Error::Io {
            what: format!("create {}", p.display()),
            source: e,
        })
    };
    cmd.stdout(create(&out)?).stderr(create(&log)?);
    Ok((out, log))
}

/// Spawns `cmd` so that it dies with this process (even on SIGKILL of the test binary).
pub(crate) fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec. It calls only
    // async-signal-safe functions (prctl, getppid) and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent died between fork() and prctl(): do not outlive it.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .send(SpawnRequest { cmd, reply: tx })
        .map_err(|_| io::Error::other("testenv spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("testenv spawner thread is gone"))?
}

/// Spawns `cmd` in a new session, so that it outlives this process.
pub(crate) fn spawn_detached(mut cmd: Command) -> io::Result<Child> {
    // SAFETY: runs in the forked child before exec; setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `sig` to the process group led by `pid` (our children lead their own
/// group), falling back to the process itself.
pub fn signal(pid: u32, sig: libc::c_int) {
    let pid = pid as libc::pid_t;
    // SAFETY: plain kill(2) calls; pid > 0 so -pid names exactly that group.
    unsafe {
        if pid > 0 && libc::kill(-pid, sig) != 0 {
            libc::kill(pid, sig);
        }
    }
}

/// True if a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // A zombie (exited, not yet reaped, e.g. orphans under a PID 1 that does not
    // reap) counts as gone.
    !matches!(proc_stat(pid), Some((state, _)) if state == 'Z')
}

/// Start time of a process (clock ticks since boot), to detect pid reuse.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// The parent of a process.
pub fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let fields = stat_fields(pid)?;
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The fields of /proc/<pid>/stat after "(comm)": state is field 3 of the
/// file (here 0), ppid 4 (1), starttime 22 (19).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// One running component.
#[derive(Debug)]
pub(crate) struct Proc {
    pub name: &'static str,
    pub child: Child,
}

/// Stops children in reverse start order (clients before servers: the
/// apiserver shuts down slowly once etcd is gone): SIGTERM, wait up to
/// `grace`, then SIGKILL; reaps each.
pub(crate) fn terminate_children(procs: &mut [Proc], grace: Duration) {
    for p in procs.iter_mut().rev() {
        let started = Instant::now();
        if matches!(p.child.try_wait(), Ok(None)) {
            signal(p.child.id(), libc::SIGTERM);
            let deadline = started + grace;
            while matches!(p.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(p.child.try_wait(), Ok(None)) {
                tracing::warn!(
                    component = p.name,
                    "testenv: no exit {grace:?} after SIGTERM, sending SIGKILL"
                );
                signal(p.child.id(), libc::SIGKILL);
            }
        }
        let _ = p.child.wait();
        tracing::debug!(
            component = p.name,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "testenv: stopped"
        );
    }
}

/// Like [`terminate_children`] for processes that are not our children
/// (`testenv down`). Returns the pids that were still alive at the end.
pub fn terminate_pids(pids: &[u32], grace: Duration) -> Vec<u32> {
    for &pid in pids {
        if pid_alive(pid) {
            signal(pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(|&p| pid_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &pid in pids {
        if pid_alive(pid) {
            signal(pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| pid_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    pids.iter().copied().filter(|&p| pid_alive(p)).collect()
}
