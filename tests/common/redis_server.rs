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
        // A port found free can be taken by a parallel test before the server binds it: then
        // the server exits at once, and another port is tried.
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            if let Some(child) = try_spawn(port, &[], None) {
                return RedisServer {
                    port,
                    child: Some(child),
                };
            }
        }
        panic!("redis-server did not start on any of {START_ATTEMPTS} free ports");
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

/// A free local port (nothing listens on it when this returns).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How many free ports a server start tries before giving up.
pub const START_ATTEMPTS: usize = 5;

/// Starts `redis-server` on `port` with `extra` arguments, in `dir` (for files it writes), and
/// waits until it accepts connections.
pub fn spawn(port: u16, extra: &[&str], dir: Option<&Path>) -> Child {
    try_spawn(port, extra, dir)
        .unwrap_or_else(|| panic!("redis-server did not start on port {port}: it exited"))
}

/// [`spawn`], or `None` when the server exits before it accepts connections (its port was
/// taken).
pub fn try_spawn(port: u16, extra: &[&str], dir: Option<&Path>) -> Option<Child> {
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
    let child = command.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start redis-server ({e}); these tests need a real Redis: \
             install it with `apt-get install -y redis-server`"
        )
    });
    let mut child = child;
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
