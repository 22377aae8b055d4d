//! A TCP proxy that forwards to a target and cuts connections at chosen points: connection
//! number `n` is closed (both directions) once it has carried `cut_after[n]` bytes toward the
//! target; connections past the list are never cut. [`CuttingProxy::cutting_every`] cuts every
//! connection after the same number of bytes (a network that keeps cutting).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

pub struct CuttingProxy {
    pub address: String,
    cuts: Arc<AtomicUsize>,
    /// How each connection ended, in order (`cut`, `client closed`, `server closed`, ...).
    endings: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl CuttingProxy {
    pub async fn start(target: &str, cut_after: Vec<usize>) -> Self {
        Self::start_with(target, move |connection| cut_after.get(connection).copied()).await
    }

    /// Cuts every connection once it has carried `bytes` toward the target.
    pub async fn cutting_every(target: &str, bytes: usize) -> Self {
        Self::start_with(target, move |_| Some(bytes)).await
    }

    async fn start_with(target: &str, cut_after: impl Fn(usize) -> Option<usize> + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let cuts = Arc::new(AtomicUsize::new(0));
        let target = target.to_string();
        let counter = Arc::clone(&cuts);
        let endings = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ended = Arc::clone(&endings);
        tokio::spawn(async move {
            let mut connection = 0usize;
            while let Ok((client, _)) = listener.accept().await {
                let limit = cut_after(connection);
                connection += 1;
                let target = target.clone();
                let counter = Arc::clone(&counter);
                let ended = Arc::clone(&ended);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        ended.lock().unwrap().push("connecting to the target failed");
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = async {
                        let mut sent = 0usize;
                        let mut buffer = vec![0u8; 16 * 1024];
                        loop {
                            let n = match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => return "client closed",
                                Ok(n) => n,
                            };
                            if server_write.write_all(&buffer[..n]).await.is_err() {
                                return "writing to the target failed";
                            }
                            sent += n;
                            if limit.is_some_and(|limit| sent >= limit) {
                                return "cut";
                            }
                        }
                    };
                    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
                    // Whichever side ends first, both directions stop (the sockets drop).
                    let ending = tokio::select! {
                        ending = upstream => ending,
                        _ = downstream => "server closed",
                    };
                    if ending == "cut" {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    ended.lock().unwrap().push(ending);
                });
            }
        });
        Self { address, cuts, endings }
    }

    /// How the connections ended so far, in order.
    pub fn endings(&self) -> Vec<&'static str> {
        self.endings.lock().unwrap().clone()
    }

    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}
