//! Admission of connections that have not upgraded yet: a cap over all peers and one per peer
//! (an IPv4 address, or an IPv6 /64: one host owns a whole /64), so that sockets nobody
//! authenticated cannot use up the descriptors the surface needs. A newcomer is never refused:
//! at its peer's cap it takes that peer's oldest place; when every place is taken, it takes the
//! oldest place of the busiest peer if that peer holds more places than the newcomer would,
//! else the oldest place of all. A surface's handshake takes milliseconds, so the oldest
//! places are the silent ones: a flood from a few addresses, or from many, cannot keep the
//! surface's own connection out. Upgraded sessions hold no place here.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Counts connections that have not upgraded yet. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gate {
    places: Arc<Mutex<Places>>,
    max: usize,
    max_per_ip: usize,
}

/// The places taken, per peer address, oldest first.
#[derive(Debug, Default)]
struct Places {
    total: usize,
    next_id: u64,
    peers: HashMap<IpAddr, VecDeque<(u64, CancellationToken)>>,
}

/// Why a connection was turned away: only a gate with no places at all refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The gate has no places (a cap of 0).
    Full,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "no connection may wait to upgrade",
        })
    }
}

/// The peer a connection counts for: its IPv4 address (also when it arrives on a dual-stack
/// socket), or the /64 of its IPv6 address.
pub fn peer_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let net = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(net.into())
        }
        v4 => v4,
    }
}

/// One admitted connection's place; dropping it (on upgrade or close) frees it.
#[derive(Debug)]
pub struct Pending {
    id: u64,
    ip: IpAddr,
    evicted: CancellationToken,
    places: Arc<Mutex<Places>>,
}

impl Gate {
    /// A gate for at most `max` waiting connections, `max_per_ip` of them from one address.
    pub fn new(max: usize, max_per_ip: usize) -> Self {
        Self {
            places: Arc::default(),
            max,
            max_per_ip,
        }
    }

    /// Takes a place for a connection from `ip` (closing an older one when needed).
    pub fn admit(&self, ip: IpAddr) -> Result<Pending, Refused> {
        if self.max == 0 || self.max_per_ip == 0 {
            return Err(Refused::Full);
        }
        let ip = peer_of(ip);
        let mut places = lock(&self.places);
        let mut own = places.peers.get(&ip).map_or(0, VecDeque::len);
        if own >= self.max_per_ip {
            places.evict_oldest_of(ip);
            own -= 1;
        }
        if places.total >= self.max {
            places.evict_for(own);
        }
        let id = places.next_id;
        places.next_id += 1;
        places.total += 1;
        let evicted = CancellationToken::new();
        places
            .peers
            .entry(ip)
            .or_default()
            .push_back((id, evicted.clone()));
        Ok(Pending {
            id,
            ip,
            evicted,
            places: Arc::clone(&self.places),
        })
    }
}

impl Places {
    /// Frees a place for a newcomer whose peer holds `own`: the oldest place of the busiest
    /// peer if it holds more than `own + 1` (so the flood gives way, not the lone client),
    /// else the oldest place of all.
    fn evict_for(&mut self, own: usize) {
        let busiest = self
            .peers
            .iter()
            .max_by_key(|(_, held)| held.len())
            .filter(|(_, held)| held.len() > own + 1)
            .map(|(peer, _)| *peer);
        let oldest = || {
            self.peers
                .iter()
                .filter_map(|(peer, held)| held.front().map(|(id, _)| (*id, *peer)))
                .min()
                .map(|(_, peer)| peer)
        };
        if let Some(victim) = busiest.or_else(oldest) {
            self.evict_oldest_of(victim);
        }
    }

    /// Closes the oldest waiting connection of `peer`.
    fn evict_oldest_of(&mut self, peer: IpAddr) {
        let Some(held) = self.peers.get_mut(&peer) else {
            return;
        };
        if let Some((_, token)) = held.pop_front() {
            token.cancel();
            self.total -= 1;
        }
        if held.is_empty() {
            self.peers.remove(&peer);
        }
    }
}

impl Pending {
    /// Resolves when a newcomer took this connection's place: close it.
    pub fn evicted(&self) -> WaitForCancellationFutureOwned {
        self.evicted.clone().cancelled_owned()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut places = lock(&self.places);
        let Some(held) = places.peers.get_mut(&self.ip) else {
            return;
        };
        let Some(at) = held.iter().position(|(id, _)| *id == self.id) else {
            // Evicted: its place is already gone.
            return;
        };
        held.remove(at);
        if held.is_empty() {
            places.peers.remove(&self.ip);
        }
        places.total -= 1;
    }
}

/// The counts stay consistent under every lock, so a panic elsewhere cannot leave them broken.
fn lock(places: &Mutex<Places>) -> MutexGuard<'_, Places> {
    places.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        [10, 0, 0, last].into()
    }

    fn is_evicted(p: &Pending) -> bool {
        p.evicted.is_cancelled()
    }

    #[test]
    fn caps_per_peer_and_frees_on_drop() {
        let gate = Gate::new(8, 2);
        let a1 = gate.admit(ip(1)).expect("first from a");
        let a2 = gate.admit(ip(1)).expect("second from a");
        // The same address over IPv6 (dual-stack) counts as the same peer: at its cap, its
        // oldest place goes.
        let mapped = IpAddr::V6(Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, 0x0001]));
        let a3 = gate.admit(mapped).expect("the peer's oldest gives way");
        assert!(is_evicted(&a1) && !is_evicted(&a2));
        drop(a1);
        assert_eq!(lock(&gate.places).total, 2);
        drop(a2);
        let a4 = gate.admit(ip(1)).expect("a place was freed");
        drop((a3, a4));
        let places = lock(&gate.places);
        assert_eq!(places.total, 0);
        assert!(places.peers.is_empty(), "no address is remembered");
    }

    #[test]
    fn when_full_the_busiest_peer_gives_way() {
        let gate = Gate::new(4, 4);
        let flood: Vec<Pending> = (0..3).map(|_| gate.admit(ip(1)).unwrap()).collect();
        let b1 = gate.admit(ip(2)).expect("a place left");
        // Full: the newcomer takes the flood's oldest place.
        let c1 = gate.admit(ip(3)).expect("the flood gives way");
        assert!(is_evicted(&flood[0]));
        assert!(!is_evicted(&flood[1]) && !is_evicted(&b1));
        // Now ip(1) holds 2, ip(2) 1, ip(3) 1: another ip(2) would hold 2 as well, so the
        // oldest place of all goes (the flood's second).
        let b2 = gate.admit(ip(2)).expect("the oldest gives way");
        assert!(is_evicted(&flood[1]) && !is_evicted(&b1));
        // A fresh peer still gets in: ip(2) now holds the most (2), so its oldest goes.
        let d1 = gate.admit(ip(4)).expect("the busiest gives way again");
        assert!(is_evicted(&b1) && !is_evicted(&flood[2]) && !is_evicted(&b2));
        // Dropping evicted connections frees nothing twice (flood[2] was still waiting).
        drop(flood);
        assert_eq!(lock(&gate.places).total, 3);
        drop((b1, b2, c1, d1));
        assert_eq!(lock(&gate.places).total, 0);
    }

    #[test]
    fn many_addresses_cannot_keep_a_newcomer_out() {
        // 200 addresses holding one place each (the probe's attack): every newcomer gets in,
        // at the oldest one's expense.
        let gate = Gate::new(32, 4);
        let flood: Vec<Pending> = (0..200u8)
            .map(|i| gate.admit([127, 0, 2, i].into()).unwrap())
            .collect();
        let surface = gate.admit(ip(9)).expect("the surface gets a place");
        assert!(!is_evicted(&surface));
        assert_eq!(flood.iter().filter(|p| !is_evicted(p)).count(), 31);
        assert_eq!(lock(&gate.places).total, 32);
        assert_eq!(Gate::new(0, 1).admit(ip(1)).unwrap_err(), Refused::Full);
    }

    #[test]
    fn an_ipv6_host_is_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_of(a), peer_of(b));
        assert_ne!(peer_of(a), peer_of(other));
        assert_eq!(peer_of(ip(1)), ip(1));
        let gate = Gate::new(8, 2);
        let first = gate.admit(a).unwrap();
        let _second = gate.admit(b).unwrap();
        let _third = gate.admit("2001:db8:1:2::3".parse().unwrap()).unwrap();
        assert!(is_evicted(&first), "the /64 holds at most 2 places");
        let _elsewhere = gate.admit(other).unwrap();
        assert_eq!(lock(&gate.places).total, 3);
    }
}
