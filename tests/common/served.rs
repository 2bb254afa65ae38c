//! A `compactor serve` process that a test starts: the binary as users run it, its log (stderr)
//! collected as it runs, its address read from the line that says it is listening.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::compactor_command;

/// The line `serve` logs once it accepts connections.
const LISTENING: &str = "Compactor is listening";

pub struct Served {
    pub child: Child,
    /// Where it listens, as its listening line says.
    pub addr: SocketAddr,
    /// The listening line itself (JSON with `--log-format json`).
    pub started: String,
    log: Arc<Mutex<String>>,
    /// The thread reading the log: it ends when the process closes its stderr.
    reader: Option<JoinHandle<()>>,
}

impl Served {
    /// Starts `compactor serve` with `args` (a port the system picks unless they name one, the
    /// memory store unless they name one) and `env` (the test's own `COMPACTOR_*` variables are
    /// not passed on), and waits until it is listening.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Served {
        let mut command = compactor_command();
        command.arg("serve");
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        if !args.contains(&"--store") {
            command.args(["--store", "memory"]);
        }
        let mut child = command
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (listening_tx, listening_rx) = mpsc::channel();
        let written = log.clone();
        // Read to the end, so that the pipe never fills and the log can be checked afterwards.
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut log = written.lock().unwrap();
                log.push_str(&String::from_utf8_lossy(&buf[..n]));
                if let Some(line) = log.lines().find(|l| l.contains(LISTENING)) {
                    let _ = listening_tx.send(line.to_string());
                }
            }
        });
        let started = listening_rx.recv_timeout(Duration::from_secs(20));
        let log_so_far = log.lock().unwrap().clone();
        let Ok(started) = started else {
            let _ = child.kill();
            panic!("not listening: {log_so_far}");
        };
        let addr = listen_address(&started)
            .unwrap_or_else(|| panic!("no address in the listening line: {started}"));
        Served {
            child,
            addr,
            started,
            log,
            reader: Some(reader),
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once a line containing `text` is in it (5 s at most).
    pub async fn log_with(&self, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.log().contains(text) {
            assert!(tokio::time::Instant::now() < deadline, "{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.log()
    }

    /// Asks it to stop as an operator would: SIGTERM, so it drains and flushes its log.
    pub fn stop(&self) {
        let stopped = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
    }

    /// How it exited, once it has (within `within`).
    pub fn exit_within(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                return exit;
            }
            assert!(Instant::now() < deadline, "still running: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it, checks that it exited cleanly, and returns its whole log, read to the end.
    pub fn stopped_log(mut self) -> String {
        self.stop();
        let exit = self.exit_within(Duration::from_secs(20));
        assert!(exit.success(), "{exit}: {}", self.log());
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.log()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address a listening line names: its `listen` field, in JSON or in text (`listen=…`).
fn listen_address(line: &str) -> Option<SocketAddr> {
    let listen = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(json) => json["listen"]
            .as_str()
            .or_else(|| json["fields"]["listen"].as_str())?
            .to_string(),
        Err(_) => line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("listen="))?
            .to_string(),
    };
    listen.parse().ok()
}
