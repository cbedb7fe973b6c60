//! A host that hangs: a loopback listener that accepts every connection and
//! never reads or answers. The tests use it as a fake proxy that must see no
//! connection, the benchmark as a target whose attempts all time out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A running hanging host. It holds every accepted socket until it is
/// dropped (the accept task is aborted, which closes them); it only listens
/// and sends nothing to anyone.
pub struct HangingHost {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HangingHost {
    /// Starts listening on a free loopback port (never 6379, the port of a
    /// Redis someone may run on this machine); panics if it cannot bind.
    pub async fn start() -> HangingHost {
        let (listener, addr) = loop {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind the hanging host to 127.0.0.1:0");
            let addr = listener
                .local_addr()
                .expect("the hanging host's local addr");
            if addr.port() != 6379 {
                break (listener, addr);
            }
        };
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        HangingHost {
            addr,
            accepted,
            task,
        }
    }

    /// `http://127.0.0.1:PORT{path}` (`path` empty or starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HangingHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}
