//! A throwaway `redis-server` for tests: started on a free local port, stoppable and
//! restartable on the same port, killed on drop. Tests that need Redis use a real one.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway `redis-server` on a local port, killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let ([port], child) = spawn_on_free_ports(|_| Vec::new(), None);
        RedisServer {
            port,
            child: Some(child),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.child = Some(spawn(self.port, &[], None));
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl RedisServer {
    /// Freezes (`true`) or thaws the server: connections stay open but nothing answers.
    pub fn freeze(&self, frozen: bool) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
    }
}

/// `N` distinct free local ports (all held until every one is chosen; nothing listens on them
/// when this returns).
fn free_ports<const N: usize>() -> [u16; N] {
    let held: [TcpListener; N] = std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|l| l.local_addr().unwrap().port())
}

/// Starts `redis-server` on the first of `N` free ports, with the arguments `extra` makes of
/// all of them, in `dir`. A port found free can be taken by a parallel test before the server
/// binds it: the server then exits at once, and other ports are tried.
pub fn spawn_on_free_ports<const N: usize>(
    extra: impl Fn([u16; N]) -> Vec<String>,
    dir: Option<&Path>,
) -> ([u16; N], Child) {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let ports = free_ports::<N>();
        if let Some(child) = try_spawn(ports[0], &extra(ports), dir) {
            return (ports, child);
        }
    }
    panic!("redis-server did not start on any of {ATTEMPTS} sets of free ports");
}

/// Starts `redis-server` on `port` with `extra` arguments, in `dir` (for files it writes), and
/// waits until it accepts connections.
pub fn spawn(port: u16, extra: &[String], dir: Option<&Path>) -> Child {
    try_spawn(port, extra, dir)
        .unwrap_or_else(|| panic!("redis-server did not start on port {port}: it exited"))
}

/// [`spawn`], or `None` when the server exits before it accepts connections (its port was
/// taken).
fn try_spawn(port: u16, extra: &[String], dir: Option<&Path>) -> Option<Child> {
    let mut command = Command::new("redis-server");
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start redis-server ({e}); these tests need a real Redis: \
             install it with `apt-get install -y redis-server`"
        )
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return None;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
