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

/// A TCP proxy in front of a database URL's host that can be severed:
/// [`SeveringProxy::sever`] closes every connection it carries and refuses new ones (accepted
/// and closed at once) until [`SeveringProxy::restore`]: a database one process can no longer
/// reach while the others still can.
pub struct SeveringProxy {
    /// The database URL with the proxy's address as its host.
    pub url: String,
    severed: tokio::sync::watch::Sender<bool>,
}

impl SeveringProxy {
    /// In front of `url` (`scheme://user@host:port/path`).
    pub async fn in_front_of(url: &str) -> Self {
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        let host_start = url[after_scheme..].find('@').map_or(after_scheme, |i| after_scheme + i + 1);
        let host_end = url[host_start..].find('/').map_or(url.len(), |i| host_start + i);
        let target = url[host_start..host_end].to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let severed = tokio::sync::watch::channel(false).0;
        let watch = severed.subscribe();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if *watch.borrow() {
                    continue;
                }
                let (mut watch, target) = (watch.clone(), target.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watch.wait_for(|severed| *severed) => {}
                    }
                });
            }
        });
        let url = format!("{}{address}{}", &url[..host_start], &url[host_end..]);
        Self { url, severed }
    }

    pub fn sever(&self) {
        self.severed.send_replace(true);
    }

    pub fn restore(&self) {
        self.severed.send_replace(false);
    }
}
