//! Connection slots: the process-wide connection limit and the per-client-IP cap. A slot is
//! held for as long as anything serves the connection, tunnels (CONNECT, WebSocket) included.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;

/// Open connections per client IP (only IPs with at least one).
#[derive(Default)]
pub struct PerIpConnections {
    counts: Mutex<HashMap<IpAddr, u32>>,
}

impl PerIpConnections {
    /// A slot for one more connection from `ip`, unless it already has `cap`.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr, cap: u32) -> Option<IpSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= cap {
            if *n == 0 {
                counts.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(IpSlot {
            owner: self.clone(),
            ip,
            cap,
        })
    }

    pub fn open_from(&self, ip: IpAddr) -> u32 {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&ip).copied().unwrap_or(0)
    }
}

/// One connection of a client IP; given back when dropped.
pub struct IpSlot {
    owner: Arc<PerIpConnections>,
    ip: IpAddr,
    cap: u32,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// What a connection holds while it lives: its place under `limits.maxConnections` and, with
/// a per-IP cap, under that.
pub struct ConnectionSlot {
    pub _permit: OwnedSemaphorePermit,
    pub _ip: Option<IpSlot>,
}

impl ConnectionSlot {
    /// A slot of its own, under the same limits, for a tunnel a multiplexed connection opens
    /// (a CONNECT or WebSocket stream of HTTP/2): each holds an upstream socket as a
    /// connection would, so one client connection cannot open more of them than
    /// `maxConnections` and its IP's cap allow. None at either limit.
    pub fn for_tunnel(&self) -> Option<ConnectionSlot> {
        let permit = self._permit.semaphore().clone().try_acquire_owned().ok()?;
        let ip = match &self._ip {
            None => None,
            Some(s) => Some(s.owner.try_take(s.ip, s.cap)?),
        };
        Some(ConnectionSlot {
            _permit: permit,
            _ip: ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_takes_a_slot_of_its_own_under_both_limits() {
        let limit = Arc::new(tokio::sync::Semaphore::new(3));
        let per_ip = Arc::new(PerIpConnections::default());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let connection = ConnectionSlot {
            _permit: limit.clone().try_acquire_owned().unwrap(),
            _ip: per_ip.try_take(ip, 2),
        };
        let tunnel = connection.for_tunnel().expect("one more under both limits");
        assert!(connection.for_tunnel().is_none(), "the IP's cap of 2");
        assert_eq!(limit.available_permits(), 1);
        drop(tunnel);
        assert_eq!(limit.available_permits(), 2);
        assert_eq!(per_ip.open_from(ip), 1);
        let anyone = ConnectionSlot {
            _permit: limit.clone().try_acquire_owned().unwrap(),
            _ip: None,
        };
        let _t1 = anyone.for_tunnel().expect("the last permit");
        assert!(anyone.for_tunnel().is_none(), "maxConnections");
    }

    #[test]
    fn a_client_ip_gets_at_most_its_cap_and_slots_come_back() {
        let p = Arc::new(PerIpConnections::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let s1 = p.try_take(a, 2).unwrap();
        let _s2 = p.try_take(a, 2).unwrap();
        assert!(p.try_take(a, 2).is_none());
        assert!(p.try_take(b, 2).is_some());
        drop(s1);
        assert_eq!(p.open_from(a), 1);
        assert!(p.try_take(a, 2).is_some());
    }
}
