//! Admission of connections that have not upgraded yet: a cap over all peers and one per peer
//! address, so that sockets nobody authenticated cannot use up the descriptors the surface
//! needs. When every place is taken, a newcomer takes the oldest place of the busiest peer if
//! that peer holds more places than the newcomer would: a flood from a few addresses cannot
//! keep the surface's own connection out. Upgraded sessions hold no place here.

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

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every place is taken and no peer holds more of them than this one would.
    Full,
    /// This peer address already holds `AGENT_MAX_PENDING_PER_IP` places.
    PeerFull,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "too many connections have not upgraded yet",
            Self::PeerFull => "this peer has too many connections that have not upgraded yet",
        })
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

    /// Takes a place for a connection from `ip`, or says why there is none.
    pub fn admit(&self, ip: IpAddr) -> Result<Pending, Refused> {
        // An IPv4 peer on a dual-stack socket must count as the same address.
        let ip = ip.to_canonical();
        let mut places = lock(&self.places);
        let own = places.peers.get(&ip).map_or(0, VecDeque::len);
        if own >= self.max_per_ip {
            return Err(Refused::PeerFull);
        }
        if places.total >= self.max {
            places.evict_for(own)?;
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
    /// Frees the oldest place of the busiest peer if it holds more than `own + 1` places
    /// (what the newcomer's peer would hold), so the flood gives way, not the lone client.
    fn evict_for(&mut self, own: usize) -> Result<(), Refused> {
        let (&victim, held) = self
            .peers
            .iter_mut()
            .max_by_key(|(_, held)| held.len())
            .ok_or(Refused::Full)?;
        if held.len() <= own + 1 {
            return Err(Refused::Full);
        }
        if let Some((_, token)) = held.pop_front() {
            token.cancel();
            self.total -= 1;
        }
        if held.is_empty() {
            self.peers.remove(&victim);
        }
        Ok(())
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
        // The same address over IPv6 (dual-stack) counts as the same peer.
        let mapped = IpAddr::V6(Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, 0x0001]));
        assert_eq!(gate.admit(mapped).unwrap_err(), Refused::PeerFull);
        drop(a1);
        let a3 = gate.admit(ip(1)).expect("a place was freed");
        drop((a2, a3));
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
        // Now ip(1) holds 2, ip(2) 1, ip(3) 1: another ip(2) would hold 2 as well, so no.
        assert_eq!(gate.admit(ip(2)).unwrap_err(), Refused::Full);
        // A fresh peer still gets in at the flood's expense.
        let d1 = gate.admit(ip(4)).expect("the flood gives way again");
        assert!(is_evicted(&flood[1]));
        // Dropping evicted connections frees nothing twice.
        drop(flood);
        assert_eq!(lock(&gate.places).total, 3);
        drop((b1, c1, d1));
        assert_eq!(lock(&gate.places).total, 0);
    }

    #[test]
    fn equals_do_not_evict_each_other() {
        let gate = Gate::new(2, 2);
        let _a = gate.admit(ip(1)).unwrap();
        let _b = gate.admit(ip(2)).unwrap();
        assert_eq!(gate.admit(ip(3)).unwrap_err(), Refused::Full);
    }
}
