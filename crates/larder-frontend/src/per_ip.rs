//! Counting open connections per client IP address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Open connections by client address, with a cap. One short critical section per accept and per
/// close: cheap next to the accept itself.
pub(crate) struct PerIpLimit {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One counted connection; dropping it gives the slot back.
pub(crate) struct IpPermit {
    owner: Arc<PerIpLimit>,
    ip: IpAddr,
}

impl PerIpLimit {
    /// `limit` 0 means no limit.
    pub(crate) fn new(limit: usize) -> Arc<PerIpLimit> {
        Arc::new(PerIpLimit {
            limit,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A permit, or `None` when `ip` already holds `limit` connections.
    pub(crate) fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<IpPermit> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if self.limit != 0 && *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(IpPermit {
            owner: self.clone(),
            ip,
        })
    }
}

impl Drop for IpPermit {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_capped_per_address_and_given_back() {
        let limit = PerIpLimit::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limit.acquire(a).unwrap();
        let _second = limit.acquire(a).unwrap();
        assert!(limit.acquire(a).is_none());
        assert!(
            limit.acquire(b).is_some(),
            "other addresses are not affected"
        );
        drop(first);
        assert!(limit.acquire(a).is_some());
    }

    #[test]
    fn zero_means_unlimited() {
        let limit = PerIpLimit::new(0);
        let ip: IpAddr = "::1".parse().unwrap();
        let permits: Vec<_> = (0..100).map(|_| limit.acquire(ip).unwrap()).collect();
        assert_eq!(permits.len(), 100);
    }
}
