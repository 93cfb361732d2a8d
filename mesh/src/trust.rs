//! Trusted hops: the addresses a forwarded identity header is believed from.
//!
//! A header such as XFCC is only as good as the hop that set it, so it is read only on
//! connections from the local sidecar (loopback) or a configured list of proxy addresses. Under
//! Istio inbound traffic reaches the pod IP through iptables, so binding to 127.0.0.1 is not
//! always possible: the check must be explicit, not an accident of the bind address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a CIDR or address does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address.
    #[error("{input:?} is not an IP address or CIDR (e.g. 127.0.0.0/8, ::1/128, 10.1.2.3)")]
    BadAddress {
        /// The input.
        input: String,
    },
    /// The prefix length is not a number within the address family's width.
    #[error("{input:?}: prefix length must be a number from 0 to {max}")]
    BadPrefix {
        /// The input.
        input: String,
        /// 32 for IPv4, 128 for IPv6.
        max: u8,
    },
}

// === Cidr ===

/// An IP network: an address and a prefix length (host bits are cleared, as Go's
/// `net.ParseCIDR` does, so `10.1.2.3/8` is `10.0.0.0/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::y/n`, or a bare address (a /32 or /128 network).
    ///
    /// # Errors
    ///
    /// [`CidrError`] for a bad address or prefix length.
    pub fn parse(input: &str) -> Result<Self, CidrError> {
        let trimmed = input.trim();
        let (addr, prefix) = match trimmed.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (trimmed, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::BadAddress { input: trimmed.to_owned() })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max && p.bytes().all(|b| b.is_ascii_digit()))
                .ok_or(CidrError::BadPrefix { input: trimmed.to_owned(), max })?,
        };
        Ok(Self { addr: mask(addr, prefix), prefix })
    }

    /// The network address.
    #[must_use]
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    #[must_use]
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a
    /// dual-stack socket reports) is compared as the IPv4 address it carries.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => mask(ip, self.prefix) == self.addr,
            _ => false,
        }
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & bits))
        }
        IpAddr::V6(a) => {
            let bits = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & bits))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// === TrustedHops ===

/// The networks whose connections may set a forwarded identity header. The default trusts
/// loopback only (`127.0.0.0/8`, `::1/128`): the sidecar in the same pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedHops {
    networks: Vec<Cidr>,
}

impl Default for TrustedHops {
    fn default() -> Self {
        Self::loopback()
    }
}

impl TrustedHops {
    /// Loopback only: `127.0.0.0/8` and `::1/128`.
    #[must_use]
    pub fn loopback() -> Self {
        Self {
            networks: vec![
                Cidr { addr: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), prefix: 8 },
                Cidr { addr: IpAddr::V6(Ipv6Addr::LOCALHOST), prefix: 128 },
            ],
        }
    }

    /// Trusts exactly `networks` (none: no hop is trusted).
    #[must_use]
    pub fn new(networks: impl IntoIterator<Item = Cidr>) -> Self {
        Self { networks: networks.into_iter().collect() }
    }

    /// Parses a comma-separated list such as `127.0.0.0/8, ::1/128, 10.0.0.7`; an empty or blank
    /// list trusts no hop.
    ///
    /// # Errors
    ///
    /// [`CidrError`] for the first entry that does not parse.
    pub fn parse_list(list: &str) -> Result<Self, CidrError> {
        let networks = list.split(',').filter(|s| !s.trim().is_empty()).map(Cidr::parse).collect::<Result<_, _>>()?;
        Ok(Self { networks })
    }

    /// Whether a connection from `ip` may set the identity header.
    #[must_use]
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(ip))
    }

    /// The trusted networks.
    #[must_use]
    pub fn networks(&self) -> &[Cidr] {
        &self.networks
    }
}
