//! A throwaway Redis Cluster for tests: three masters (no replicas) on free local ports, joined
//! with `redis-cli --cluster create`; one master can be stopped and restarted on the same port
//! with its cluster configuration (it rejoins owning the same slots, its data gone). Killed on
//! drop.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{spawn, spawn_on_free_ports};

const MASTERS: usize = 3;

struct Node {
    port: u16,
    /// The cluster bus port (set explicitly: the default, port + 10000, may be taken).
    bus: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Node {
    /// A new node on two free ports: its own and its cluster bus.
    fn first_start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let ([port, bus], child) =
            spawn_on_free_ports(|[_, bus]| Node::arguments(bus), Some(dir.path()));
        Node {
            port,
            bus,
            dir,
            child: Some(child),
        }
    }

    fn arguments(bus: u16) -> Vec<String> {
        [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
            "--cluster-config-file",
            "nodes.conf",
            // A stopped master is noticed within a second, so outage tests stay short.
            "--cluster-node-timeout",
            "1000",
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// Starts a stopped node again on its ports, with its cluster configuration.
    fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.child = Some(spawn(
            self.port,
            &Node::arguments(self.bus),
            Some(self.dir.path()),
        ));
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Three local Redis masters forming one cluster, killed on drop.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<Node> = (0..MASTERS).map(|_| Node::first_start()).collect();
        let cluster = RedisCluster { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli (from the redis-tools package) creates the cluster");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_until_ok();
        cluster
    }

    /// `redis+cluster://` with every master, the form Compactor's `store` setting takes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}/", hosts.join(","))
    }

    /// A plain `redis://` URL of one master (for inspecting what it holds).
    pub fn node_url(&self, index: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.nodes[index].port)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Stops one master: its slots become unreachable (and, after the node timeout, every
    /// node reports the cluster down).
    pub fn stop(&mut self, index: usize) {
        self.nodes[index].stop();
    }

    /// Restarts a stopped master on its port and waits until the cluster is whole again.
    pub fn restart(&mut self, index: usize) {
        self.nodes[index].start();
        self.wait_until_ok();
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_until_ok(&self) {
        self.wait_for_state("ok");
    }

    /// Waits until every running node reports the cluster down (after a master stopped).
    pub fn wait_until_down(&self) {
        self.wait_for_state("fail");
    }

    fn wait_for_state(&self, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .all(|n| cluster_state(n.port).as_deref() == Some(state))
        {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:{state}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What a node says of the cluster (`ok` or `fail`), if it answers.
fn cluster_state(port: u16) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("cluster_state:").map(str::to_string))
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
    }
}
