//! The connections being served, as the accept loop needs them: how many each peer has open (a
//! peer at `max_connections_per_peer` is refused at accept) and which one has been idle longest
//! (asked to close when every connection is taken and another waits, as nginx reuses its idle
//! keep-alive connections: idle ones cannot lock a gateway out until their idle timeout).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::activity::{Activity, CloseReason};

/// A peer as the per-peer cap counts it: an IPv4 address, or an IPv6 /64 (what one host or one
/// subscriber is usually given; counting single IPv6 addresses would let one host take the
/// whole gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerKey(IpAddr);

impl PeerKey {
    fn of(peer: SocketAddr) -> Self {
        match peer.ip() {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => Self(IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into())),
            },
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    connections: HashMap<u64, Arc<Activity>>,
    per_peer: HashMap<PeerKey, usize>,
}

/// The connections being served.
#[derive(Debug)]
pub(super) struct OpenConnections {
    max_per_peer: Option<usize>,
    table: Mutex<Table>,
}

/// A connection's place among the open ones, given back when dropped.
#[derive(Debug)]
pub(super) struct Admitted {
    connections: Arc<OpenConnections>,
    id: u64,
    peer: PeerKey,
}

impl OpenConnections {
    pub(super) fn new(max_per_peer: Option<usize>) -> Arc<Self> {
        Arc::new(Self { max_per_peer, table: Mutex::new(Table::default()) })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Table> {
        self.table.lock()
    }

    /// A place for a connection from `peer`; `None` when the peer has as many open as it may.
    pub(super) fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Admitted> {
        let peer = PeerKey::of(peer);
        let mut table = self.lock();
        let open = table.per_peer.get(&peer).copied().unwrap_or(0);
        if self.max_per_peer.is_some_and(|max| open >= max) {
            return None;
        }
        table.per_peer.insert(peer, open + 1);
        let id = table.next_id;
        table.next_id += 1;
        Some(Admitted { connections: Arc::clone(self), id, peer })
    }

    /// Asks the connection idle the longest to close; `false` when none is idle.
    pub(super) fn close_longest_idle(&self) -> bool {
        let longest = {
            let table = self.lock();
            let idle = table.connections.values().filter_map(|activity| Some((activity.idle_since()?, activity)));
            idle.min_by_key(|(since, _)| *since).map(|(_, activity)| Arc::clone(activity))
        };
        let Some(activity) = longest else { return false };
        activity.request_close(CloseReason::IdleAtCapacity);
        true
    }
}

impl Admitted {
    /// The connection is served (it has its place under `max_connections`): from now on it may be
    /// asked to close when idle. One still waiting for its place never is.
    pub(super) fn served(&self, activity: Arc<Activity>) {
        self.connections.lock().connections.insert(self.id, activity);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut table = self.connections.lock();
        table.connections.remove(&self.id);
        if let Some(open) = table.per_peer.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                table.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_peers_count_by_their_64_bit_prefix_and_mapped_ipv4_as_ipv4() {
        let a: SocketAddr = "[2001:db8:1:2::1]:1000".parse().unwrap();
        let b: SocketAddr = "[2001:db8:1:2:ffff::9]:2000".parse().unwrap();
        let c: SocketAddr = "[2001:db8:1:3::1]:1000".parse().unwrap();
        assert_eq!(PeerKey::of(a), PeerKey::of(b));
        assert_ne!(PeerKey::of(a), PeerKey::of(c));
        let mapped: SocketAddr = "[::ffff:192.0.2.7]:1".parse().unwrap();
        let v4: SocketAddr = "192.0.2.7:2".parse().unwrap();
        assert_eq!(PeerKey::of(mapped), PeerKey::of(v4));
    }
}
