//! Turning flags and the optional TOML file into a checked plan. Every
//! error names the option as it was given (the flag, or the file's key)
//! and what a good value looks like.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use stack::host::NeighbourConfig;
use stack::runtime::{IdlePolicy, PingConfig, RuntimeConfig, SteeringMode};
use stack::wire::EthernetAddress;

use super::args::DpArgs;
use crate::cpulist;
use crate::error::{Error, Result};

/// The TOML file: the same options as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub lcores: Option<String>,
    pub pci: Option<String>,
    pub vdev: Option<String>,
    pub tap_iface: Option<String>,
    pub ip: Option<String>,
    pub gateway: Option<String>,
    pub mac: Option<String>,
    pub vlan: Option<u16>,
    #[serde(default)]
    pub neighbours: Vec<String>,
    pub arp_max_entries: Option<usize>,
    pub arp_reachable: Option<f64>,
    #[serde(default)]
    pub udp_echo: Vec<u16>,
    pub steering: Option<String>,
    pub symmetric_rss: Option<bool>,
    pub idle: Option<String>,
    pub mtu: Option<u16>,
    pub mbufs: Option<u32>,
    pub mbuf_arena: Option<bool>,
    pub checksum_offload: Option<bool>,
    pub impair: Option<String>,
    pub ping: Option<String>,
    pub ping_count: Option<u32>,
    pub ping_interval: Option<f64>,
    pub stats_period: Option<f64>,
    pub duration: Option<f64>,
    #[serde(default)]
    pub eal: Vec<String>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("reading config {}", path.display()), e))?;
        toml::from_str(&text).map_err(|e| {
            // toml's own Display spans several lines; one line, with where.
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
            let at = line.map_or(String::new(), |l| format!(" line {l}"));
            Error::Usage(format!("config {}{at}: {}", path.display(), e.message()))
        })
    }
}

/// Most mbufs in the packet pool.
const MAX_MBUFS: u32 = 1 << 24;

/// Everything ainftp-dp needs to start.
#[derive(Debug, Clone)]
pub struct Plan {
    pub lcores: Vec<u32>,
    pub pci: Vec<String>,
    pub runtime: RuntimeConfig,
    pub udp_echo: Vec<u16>,
    /// `--ping`: echo requests from our stack.
    pub ping: Option<PingConfig>,
    /// Packet buffers in a gpudirect arena (`--mbuf-arena`).
    pub mbuf_arena: bool,
    pub stats_period: Option<Duration>,
    pub duration: Option<Duration>,
    pub eal: Vec<String>,
    /// The TAP device created when no port is given: it must not exist yet.
    pub default_tap: Option<String>,
}

/// Where a setting's value came from, as its errors name it: the flag,
/// or the config file's key of the same name.
#[derive(Clone, Copy)]
struct Origin<'a> {
    flag: &'static str,
    file: Option<&'a Path>,
}

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.file {
            Some(path) => {
                // The file's keys are the flags' names with underscores,
                // except the list the repeatable --neighbour fills.
                let key = match self.flag {
                    "--neighbour" => "neighbours".to_owned(),
                    flag => flag.trim_start_matches("--").replace('-', "_"),
                };
                write!(f, "{key} in {}", path.display())
            }
            None => f.write_str(self.flag),
        }
    }
}

/// The origin of a setting the command line gave (`on_command_line`) or
/// else the file.
fn origin<'a>(flag: &'static str, on_command_line: bool, args: &'a DpArgs) -> Origin<'a> {
    Origin {
        flag,
        file: args.config.as_deref().filter(|_| !on_command_line),
    }
}

pub fn plan(args: &DpArgs) -> Result<Plan> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let from = |flag: &'static str, given: bool| origin(flag, given, args).to_string();
    let lcores = match args.lcores.as_ref().or(file.lcores.as_ref()) {
        Some(list) => cpulist::parse(list).map_err(|e| {
            Error::Usage(format!(
                "{} {list:?}: {e}",
                from("--lcores", args.lcores.is_some())
            ))
        })?,
        None => crate::eal_setup::default_lcores()?,
    };
    // The port is one choice: a --pci or --vdev flag replaces whichever
    // of the two the file names.
    let (pci, vdev) = if args.pci.is_some() || args.vdev.is_some() {
        (args.pci.clone(), args.vdev.clone())
    } else {
        let pci = file
            .pci
            .as_deref()
            .map(crate::eal_setup::parse_pci)
            .transpose()
            .map_err(|e| Error::Usage(format!("{}: {e}", from("--pci", false))))?;
        (pci, file.vdev.clone())
    };
    if vdev.as_deref().is_some_and(|v| v.trim().is_empty()) {
        return Err(Error::Usage(format!(
            "{} is empty: name a device, e.g. --vdev net_af_xdp0,iface=veth1",
            from("--vdev", args.vdev.is_some())
        )));
    }
    if pci.is_some() && vdev.is_some() {
        return Err(Error::Usage(format!(
            "give either {} or {}, not both (one port per ainftp-dp)",
            from("--pci", args.pci.is_some()),
            from("--vdev", args.vdev.is_some())
        )));
    }
    let tap = args
        .tap_iface
        .clone()
        .or(file.tap_iface.clone())
        .unwrap_or_else(|| "dtap0".into());
    let device = match (&pci, &vdev) {
        (Some(p), _) => p.clone(),
        (_, Some(v)) => v.clone(),
        _ => format!("net_tap0,iface={tap}"),
    };
    let default_tap = (pci.is_none() && vdev.is_none()).then_some(tap);
    if let Some(tap) = &default_tap {
        check_ifname(tap, &from("--tap-iface", args.tap_iface.is_some()))?;
    }
    let ip_text = args.ip.as_ref().or(file.ip.as_ref()).ok_or_else(|| {
        Error::Usage("--ip is required: our address and prefix, e.g. --ip 10.0.0.2/24".into())
    })?;
    let (ip, prefix_len) = parse_cidr_of(&from("--ip", args.ip.is_some()), ip_text)?;
    let mut rt = RuntimeConfig::new(&device, ip, prefix_len);
    rt.gateway = args
        .gateway
        .as_ref()
        .or(file.gateway.as_ref())
        .map(|g| parse_ip(&from("--gateway", args.gateway.is_some()), g))
        .transpose()?;
    rt.mac = args
        .mac
        .as_ref()
        .or(file.mac.as_ref())
        .map(|m| parse_mac(&from("--mac", args.mac.is_some()), m))
        .transpose()?;
    rt.vlan = args.vlan.or(file.vlan);
    let neighbours = if args.neighbours.is_empty() {
        &file.neighbours
    } else {
        &args.neighbours
    };
    let neighbour = from("--neighbour", !args.neighbours.is_empty());
    rt.static_neighbours = neighbours
        .iter()
        .map(|n| parse_neighbour(&neighbour, n))
        .collect::<Result<_>>()?;
    neighbour_plan(args, &file, &mut rt.neighbour)?;
    check_host(&rt)?;
    if let Some(s) = args.steering.as_ref().or(file.steering.as_ref()) {
        rt.steering = s.parse::<SteeringMode>().map_err(|e| {
            Error::Usage(format!(
                "{}: {e}",
                from("--steering", args.steering.is_some())
            ))
        })?;
    }
    rt.symmetric_rss = args.symmetric_rss.or(file.symmetric_rss).unwrap_or(false);
    rt.idle = match args.idle.as_ref().or(file.idle.as_ref()) {
        Some(s) => s
            .parse::<IdlePolicy>()
            .map_err(|e| Error::Usage(format!("{}: {e}", from("--idle", args.idle.is_some()))))?,
        None => {
            let isolated = std::fs::read_to_string(ISOLATED_CPUS).unwrap_or_default();
            default_idle(&lcores, &isolated)
        }
    };
    rt.mtu = args.mtu.or(file.mtu);
    if let Some(mtu) = rt.mtu.filter(|&m| m < MIN_MTU) {
        return Err(Error::Usage(format!(
            "{} {mtu} is below IPv4's minimum of {MIN_MTU}",
            from("--mtu", args.mtu.is_some())
        )));
    }
    if let Some(n) = args.mbufs.or(file.mbufs) {
        let mbufs = from("--mbufs", args.mbufs.is_some());
        if n < 1024 {
            return Err(Error::Usage(format!(
                "{mbufs} {n} is too few; at least 1024 (rx rings alone take 1024 per queue on many PMDs)"
            )));
        }
        // About 2.2 KB of hugepage memory each: 2^24 is 36 GB already.
        if n > MAX_MBUFS {
            return Err(Error::Usage(format!(
                "{mbufs} {n} is too many; at most {MAX_MBUFS} (each takes about 2.2 KB of hugepages)"
            )));
        }
        rt.mbufs = n;
    }
    rt.checksum_offload = args
        .checksum_offload
        .or(args.no_checksum_offload.then_some(false))
        .or(file.checksum_offload)
        .unwrap_or(true);
    if let Some(spec) = args.impair.as_ref().or(file.impair.as_ref()) {
        let cfg: stack::io::impair::ImpairConfig = spec.parse().map_err(|e| {
            let impair = from("--impair", args.impair.is_some());
            Error::Usage(format!("{impair} {spec:?}: {e}"))
        })?;
        rt.impair = (!cfg.is_perfect()).then_some(cfg);
    }
    let udp_echo = if args.udp_echo.is_empty() {
        file.udp_echo.clone()
    } else {
        args.udp_echo.clone()
    };
    let echo = from("--udp-echo", !args.udp_echo.is_empty());
    if udp_echo.contains(&0) {
        return Err(Error::Usage(format!("{echo} 0 is not a port; use 1-65535")));
    }
    if let Some(port) = udp_echo
        .iter()
        .enumerate()
        .find_map(|(i, p)| udp_echo[..i].contains(p).then_some(p))
    {
        return Err(Error::Usage(format!("{echo} {port} is given twice")));
    }
    let ping = ping_plan(args, &file, &rt)?;
    let stats_period = seconds(
        &from("--stats-period", args.stats_period.is_some()),
        args.stats_period.or(file.stats_period).unwrap_or(1.0),
    )?;
    let duration = seconds(
        &from("--duration", args.duration.is_some()),
        args.duration.or(file.duration).unwrap_or(0.0),
    )?;
    let mut eal = file.eal.clone();
    eal.extend(args.eal.iter().cloned());
    Ok(Plan {
        lcores,
        pci: pci.into_iter().collect(),
        runtime: rt,
        udp_echo,
        ping,
        mbuf_arena: args.mbuf_arena.or(file.mbuf_arena).unwrap_or(false),
        stats_period,
        duration,
        eal,
        default_tap,
    })
}

/// Longest interface name Linux takes (IFNAMSIZ less the NUL).
const MAX_IFNAME: usize = 15;

/// `--tap-iface`: a name Linux takes for an interface, that also fits in
/// DPDK's device arguments (`net_tap0,iface=NAME`: no `,` or `=`).
fn check_ifname(name: &str, option: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::Usage(format!("{option} {name:?}: {why}")));
    if name.is_empty() || name.len() > MAX_IFNAME {
        return bad(&format!("an interface name is 1 to {MAX_IFNAME} bytes"));
    }
    if name == "." || name == ".." {
        return bad("not an interface name");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | ':' | ',' | '='))
    {
        return bad(&format!("{c:?} cannot be in an interface name here"));
    }
    Ok(())
}

/// The smallest MTU IPv4 allows (RFC 791).
pub const MIN_MTU: u16 = 68;

/// The MAC the host settings are checked with before the port, whose MAC
/// is the real one, exists: any unicast address does.
const STAND_IN_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);

/// Where the host `rt` describes sends a packet for `dst`: `dst` in its
/// subnet, else its gateway; None when it has no route.
pub fn next_hop(rt: &RuntimeConfig, dst: std::net::Ipv4Addr) -> Option<std::net::Ipv4Addr> {
    rt.host_config(rt.mac.unwrap_or(STAND_IN_MAC)).next_hop(dst)
}

/// Checks the address, gateway, VLAN and MAC before DPDK starts (the
/// runtime checks them again once the port is up): a mistake there is
/// named at once, not after EAL's start-up or a TAP device made for
/// nothing.
pub fn check_host(rt: &RuntimeConfig) -> Result<()> {
    rt.host_config(rt.mac.unwrap_or(STAND_IN_MAC))
        .validate()
        .map_err(Error::Usage)
}

/// Most neighbours `--arp-max-entries` takes. Every lcore copies the whole
/// table (about 40 bytes an entry) when an entry is learned or refreshed,
/// and refreshes come about once per entry every half `reachable`: at
/// 16384 entries and 60 s that is some 550 copies of 650 KB a second per
/// lcore, as far as this design goes.
const MAX_ARP_ENTRIES: usize = 16384;

/// `--arp-max-entries` and `--arp-reachable` (flags over the file).
fn neighbour_plan(args: &DpArgs, file: &FileConfig, cfg: &mut NeighbourConfig) -> Result<()> {
    if let Some(n) = args.arp_max_entries.or(file.arp_max_entries) {
        if !(1..=MAX_ARP_ENTRIES).contains(&n) {
            return Err(Error::Usage(format!(
                "{} {n}: give 1 to {MAX_ARP_ENTRIES}",
                origin("--arp-max-entries", args.arp_max_entries.is_some(), args)
            )));
        }
        cfg.max_entries = n;
    }
    if let Some(s) = args.arp_reachable.or(file.arp_reachable) {
        // Below a second, ARP traffic would grow with every peer.
        if !(1.0..=86_400.0).contains(&s) {
            return Err(Error::Usage(format!(
                "{} {s}: give 1 to 86400 seconds",
                origin("--arp-reachable", args.arp_reachable.is_some(), args)
            )));
        }
        cfg.reachable = Duration::from_secs_f64(s);
    }
    Ok(())
}

/// ICMP data bytes per echo request, as `ping` sends by default.
const PING_DATA_BYTES: usize = 56;

/// `--ping ADDR [--ping-count N] [--ping-interval SECS]` (flags over the
/// file): an address we can route to, other than our own.
fn ping_plan(args: &DpArgs, file: &FileConfig, rt: &RuntimeConfig) -> Result<Option<PingConfig>> {
    let count = args.ping_count.or(file.ping_count);
    let interval = args.ping_interval.or(file.ping_interval);
    let Some(target) = args.ping.as_ref().or(file.ping.as_ref()) else {
        let given = match (count, interval) {
            (Some(_), _) => origin("--ping-count", args.ping_count.is_some(), args),
            (_, Some(_)) => origin("--ping-interval", args.ping_interval.is_some(), args),
            _ => return Ok(None),
        };
        return Err(Error::Usage(format!(
            "{given} goes with a ping address (--ping ADDR, or ping in the config file)"
        )));
    };
    let ping = origin("--ping", args.ping.is_some(), args);
    let target: Ipv4Addr = target
        .parse()
        .map_err(|_| Error::Usage(format!("{ping} {target:?} is not an IPv4 address")))?;
    // The runtime's routing (the MAC is the port's, not known yet, and
    // plays no part in it).
    let host = rt.host_config(STAND_IN_MAC);
    if target == host.ip {
        return Err(Error::Usage(format!("{ping} {target} is our own address")));
    }
    if target.is_unspecified()
        || target.is_multicast()
        || target.is_broadcast()
        || target.is_loopback()
    {
        return Err(Error::Usage(format!("{ping} {target}: not a host address")));
    }
    if let Some(which) = host.reserved_in_subnet(target) {
        return Err(Error::Usage(format!(
            "{ping} {target} is the {which} address of {}/{}, not a host",
            host.ip, host.prefix_len
        )));
    }
    if host.next_hop(target).is_none() {
        return Err(Error::Usage(format!(
            "{ping} {target} is outside {}/{} and there is no --gateway",
            host.ip, host.prefix_len
        )));
    }
    if count == Some(0) {
        return Err(Error::Usage(format!(
            "{} 0: give 1 or more",
            origin("--ping-count", args.ping_count.is_some(), args)
        )));
    }
    let interval = match interval {
        None => Duration::from_secs(1),
        Some(s) if (0.001..=3600.0).contains(&s) => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(Error::Usage(format!(
                "{} {s}: give 0.001 to 3600 seconds",
                origin("--ping-interval", args.ping_interval.is_some(), args)
            )))
        }
    };
    Ok(Some(PingConfig {
        target,
        count,
        interval,
        data_len: PING_DATA_BYTES,
    }))
}

/// The kernel's isolated CPUs (`isolcpus=`), in the Linux list syntax.
const ISOLATED_CPUS: &str = "/sys/devices/system/cpu/isolated";

/// Busy polling when every lcore is an isolated CPU (`isolated`: the
/// kernel's list, empty when none), where a spinning loop takes nothing
/// from anyone; adaptive backoff otherwise.
fn default_idle(lcores: &[u32], isolated: &str) -> IdlePolicy {
    let isolated = match isolated.trim() {
        "" => return IdlePolicy::Adaptive,
        list => cpulist::parse(list).unwrap_or_default(),
    };
    if !lcores.is_empty() && lcores.iter().all(|c| isolated.contains(c)) {
        IdlePolicy::Busy
    } else {
        IdlePolicy::Adaptive
    }
}

fn seconds(flag: &str, s: f64) -> Result<Option<Duration>> {
    // The bound keeps `Duration` and `Instant` arithmetic from panicking.
    if !(0.0..=crate::seconds::MAX_SECONDS).contains(&s) {
        return Err(Error::Usage(format!(
            "{flag} {s}: expected seconds from 0 to {} (a year)",
            crate::seconds::MAX_SECONDS
        )));
    }
    Ok((s > 0.0).then(|| Duration::from_secs_f64(s)))
}

pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8)> {
    parse_cidr_of("--ip", s)
}

/// `parse_cidr` for the option named `option`.
fn parse_cidr_of(option: &str, s: &str) -> Result<(Ipv4Addr, u8)> {
    let bad = || {
        Error::Usage(format!(
            "{option} {s:?}: expected an IPv4 address with a prefix length, e.g. 10.0.0.2/24"
        ))
    };
    let (addr, len) = s.split_once('/').ok_or_else(bad)?;
    let ip: Ipv4Addr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    if len > 32 {
        return Err(bad());
    }
    Ok((ip, len))
}

fn parse_ip(flag: &str, s: &str) -> Result<Ipv4Addr> {
    s.parse().map_err(|_| {
        Error::Usage(format!(
            "{flag} {s:?}: expected an IPv4 address like 10.0.0.1"
        ))
    })
}

fn parse_mac(flag: &str, s: &str) -> Result<EthernetAddress> {
    let mac: EthernetAddress = s.parse().map_err(|_| {
        Error::Usage(format!(
            "{flag} {s:?}: expected a MAC address like 02:00:00:00:00:01"
        ))
    })?;
    // A device may report it (net_ring does), but nobody should give it.
    if mac.0 == [0; 6] {
        return Err(Error::Usage(format!(
            "{flag} {s}: the all-zero MAC names no station"
        )));
    }
    Ok(mac)
}

fn parse_neighbour(option: &str, s: &str) -> Result<(Ipv4Addr, EthernetAddress)> {
    let (ip, mac) = s.split_once('=').ok_or_else(|| {
        Error::Usage(format!(
            "{option} {s:?}: expected IP=MAC, e.g. 10.0.0.1=02:00:00:00:00:01"
        ))
    })?;
    Ok((parse_ip(option, ip)?, parse_mac(option, mac)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(list: &[&str]) -> DpArgs {
        DpArgs::parse_from(std::iter::once("ainftp-dp").chain(list.iter().copied()))
    }

    #[test]
    fn defaults_to_a_tap_device_and_one_second_stats() {
        let p = plan(&args(&["--ip", "10.0.0.2/24", "--lcores", "0"])).unwrap();
        assert_eq!(p.runtime.device, "net_tap0,iface=dtap0");
        assert_eq!(p.runtime.ip, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(p.runtime.prefix_len, 24);
        assert_eq!(p.stats_period, Some(Duration::from_secs(1)));
        assert_eq!(p.duration, None);
        assert_eq!(p.lcores, vec![0]);
    }

    #[test]
    fn neighbour_table_limits_come_from_flags_or_the_file() {
        let base = ["--ip", "10.0.0.2/24", "--lcores", "0"];
        let with = |extra: &[&str]| plan(&args(&[&base[..], extra].concat()));
        let d = with(&[]).unwrap().runtime.neighbour;
        assert_eq!(
            (d.max_entries, d.reachable),
            (4096, Duration::from_secs(60))
        );
        let n = with(&["--arp-max-entries", "12000", "--arp-reachable", "30"])
            .unwrap()
            .runtime
            .neighbour;
        assert_eq!(
            (n.max_entries, n.reachable),
            (12000, Duration::from_secs(30))
        );
        for (flag, bad, says) in [
            ("--arp-max-entries", "0", "give 1 to"),
            ("--arp-max-entries", "16385", "give 1 to 16384"),
            ("--arp-reachable", "0.5", "give 1 to 86400"),
            ("--arp-reachable", "-3", "give 1 to 86400"),
        ] {
            let e = with(&[flag, bad]).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains(says), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            "arp_max_entries = 9000
arp_reachable = 20.0
",
        )
        .unwrap();
        let f = with(&["--config", file.to_str().unwrap(), "--arp-reachable", "45"])
            .unwrap()
            .runtime
            .neighbour;
        assert_eq!(
            (f.max_entries, f.reachable),
            (9000, Duration::from_secs(45))
        );
    }

    #[test]
    fn a_bad_value_from_the_file_is_named_by_its_key_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        let path = file.to_str().unwrap();
        let base = "ip = \"10.0.0.2/24\"\nlcores = \"0\"\n";
        let cases = [
            ("mtu = 40", "mtu in {} 40 is below"),
            ("mbufs = 10", "mbufs in {} 10 is too few"),
            ("steering = \"bogus\"", "steering in {}: "),
            ("tap_iface = \"a,b\"", "tap_iface in {} \"a,b\""),
            ("gateway = \"x\"", "gateway in {} \"x\""),
            ("mac = \"00:00:00:00:00:00\"", "mac in {} 00:00:00:00:00:00"),
            ("neighbours = [\"x\"]", "neighbours in {} \"x\""),
            ("udp_echo = [0]", "udp_echo in {} 0 is not a port"),
            ("arp_reachable = 0.5", "arp_reachable in {} 0.5"),
            (
                "ping = \"10.0.0.2\"",
                "ping in {} 10.0.0.2 is our own address",
            ),
            ("ping = \"10.0.0.1\"\nping_count = 0", "ping_count in {} 0"),
            ("stats_period = -1.0", "stats_period in {} -1"),
            ("impair = \"loss=x\"", "impair in {} \"loss=x\""),
            (
                "ping_interval = 2.0",
                "ping_interval in {} goes with a ping address",
            ),
            (
                "vdev = \"net_null0\"\npci = \"0000:3b:00.0\"",
                "give either pci in {} or vdev in {}, not both",
            ),
        ];
        for (line, want) in cases {
            std::fs::write(&file, format!("{base}{line}\n")).unwrap();
            let e = plan(&args(&["--config", path])).unwrap_err().to_string();
            let want = want.replace("{}", path);
            assert!(e.contains(&want), "{line}: {e}");
        }
        for (text, want) in [
            (
                "lcores = \"x\"\nip = \"10.0.0.2/24\"\n",
                "lcores in {} \"x\"",
            ),
            (
                "lcores = \"0\"\nip = \"10.0.0.2\"\n",
                "ip in {} \"10.0.0.2\"",
            ),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = plan(&args(&["--config", path])).unwrap_err().to_string();
            assert!(e.contains(&want.replace("{}", path)), "{text}: {e}");
        }
        // Given as a flag, the same value is named by the flag.
        std::fs::write(&file, base).unwrap();
        let e = plan(&args(&["--config", path, "--mtu", "40"])).unwrap_err();
        assert!(e.to_string().starts_with("--mtu 40 is below"), "{e}");
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            "ip = \"10.1.0.2/16\"\nudp_echo = [7, 9]\nlcores = \"0\"\nvdev = \"net_null0\"\nneighbours = [\"10.1.0.1=02:00:00:00:00:01\"]\n",
        )
        .unwrap();
        let p = plan(&args(&[
            "--config",
            file.to_str().unwrap(),
            "--udp-echo",
            "5",
        ]))
        .unwrap();
        assert_eq!(p.runtime.ip, Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(p.runtime.device, "net_null0");
        assert_eq!(p.udp_echo, vec![5]);
        assert_eq!(p.runtime.static_neighbours.len(), 1);
        std::fs::write(&file, "ip = \"10.1.0.2/16\"\nbogus = 1\n").unwrap();
        let e = plan(&args(&["--config", file.to_str().unwrap()])).unwrap_err();
        assert!(
            e.to_string().contains("line 2: unknown field `bogus`"),
            "{e}"
        );
        // A wrong type says on which line.
        std::fs::write(&file, "ip = \"10.1.0.2/16\"\nudp_echo = 7\n").unwrap();
        let e = plan(&args(&["--config", file.to_str().unwrap()])).unwrap_err();
        assert!(e.to_string().contains("line 2: invalid type"), "{e}");
        // The port is one choice: a --vdev flag replaces the file's --pci.
        std::fs::write(&file, "ip = \"10.1.0.2/16\"\npci = \"0000:3b:00.0\"\n").unwrap();
        let p = plan(&args(&[
            "--config",
            file.to_str().unwrap(),
            "--vdev",
            "net_null0",
        ]))
        .unwrap();
        assert_eq!(p.runtime.device, "net_null0");
        assert!(p.pci.is_empty() && p.default_tap.is_none());
        // Switches work both ways: the file turns them on, flags off (or on).
        std::fs::write(
            &file,
            "ip = \"10.1.0.2/16\"\nvdev = \"net_null0\"\nsymmetric_rss = true\nmbuf_arena = true\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let p = plan(&args(&["--config", f])).unwrap();
        assert!(p.runtime.symmetric_rss && p.mbuf_arena);
        let p = plan(&args(&[
            "--config",
            f,
            "--symmetric-rss=false",
            "--mbuf-arena=false",
        ]))
        .unwrap();
        assert!(!p.runtime.symmetric_rss && !p.mbuf_arena);
        std::fs::write(
            &file,
            "ip = \"10.1.0.2/16\"\nvdev = \"net_null0\"\nchecksum_offload = false\n",
        )
        .unwrap();
        assert!(
            !plan(&args(&["--config", f]))
                .unwrap()
                .runtime
                .checksum_offload
        );
        let on = plan(&args(&["--config", f, "--checksum-offload=true"])).unwrap();
        assert!(on.runtime.checksum_offload);
        let off = plan(&args(&[
            "--ip",
            "10.0.0.2/24",
            "--lcores",
            "0",
            "--no-checksum-offload",
        ]));
        assert!(!off.unwrap().runtime.checksum_offload);
        let p = plan(&args(&[
            "--ip",
            "10.0.0.2/24",
            "--lcores",
            "0",
            "--symmetric-rss",
        ]))
        .unwrap();
        assert!(p.runtime.symmetric_rss && !p.mbuf_arena);
    }

    #[test]
    fn idle_defaults_to_busy_only_on_isolated_cpus() {
        assert_eq!(default_idle(&[2, 3], ""), IdlePolicy::Adaptive);
        assert_eq!(default_idle(&[2, 3], "\n"), IdlePolicy::Adaptive);
        assert_eq!(default_idle(&[2, 3], "2-7\n"), IdlePolicy::Busy);
        assert_eq!(default_idle(&[2, 3], "1,3,5"), IdlePolicy::Adaptive);
        assert_eq!(default_idle(&[1, 3], "1,3,5"), IdlePolicy::Busy);
        assert_eq!(default_idle(&[2], "junk"), IdlePolicy::Adaptive);
        // An explicit policy wins over the default either way.
        let p = plan(&args(&[
            "--ip",
            "10.0.0.2/24",
            "--lcores",
            "0",
            "--idle",
            "busy",
        ]))
        .unwrap();
        assert_eq!(p.runtime.idle, IdlePolicy::Busy);
    }

    #[test]
    fn ping_takes_a_routable_address_and_its_options() {
        let base = ["--ip", "10.0.0.2/24", "--lcores", "0"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            plan(&args(&v))
        };
        let p = with(&[
            "--ping",
            "10.0.0.1",
            "--ping-count",
            "3",
            "--ping-interval",
            "0.2",
        ])
        .unwrap()
        .ping
        .unwrap();
        assert_eq!(p.target, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.count, Some(3));
        assert_eq!(p.interval, Duration::from_millis(200));
        assert_eq!(p.data_len, 56);
        let p = with(&["--ping", "10.0.0.1"]).unwrap().ping.unwrap();
        assert_eq!((p.count, p.interval), (None, Duration::from_secs(1)));
        assert!(with(&[]).unwrap().ping.is_none());
        // Outside the subnet only through a gateway.
        assert!(with(&["--ping", "8.8.8.8", "--gateway", "10.0.0.1"])
            .unwrap()
            .ping
            .is_some());
        for (extra, needle) in [
            (vec!["--ping", "8.8.8.8"], "no --gateway"),
            (vec!["--ping", "10.0.0.2"], "our own address"),
            (vec!["--ping", "10.0.0"], "not an IPv4 address"),
            (vec!["--ping", "224.0.0.1"], "not a host address"),
            (vec!["--ping", "127.0.0.1"], "not a host address"),
            (vec!["--ping", "10.0.0.255"], "broadcast address"),
            (vec!["--ping", "10.0.0.0"], "network address"),
            (
                vec!["--ping-count", "3"],
                "--ping-count goes with a ping address",
            ),
            (
                vec!["--ping", "10.0.0.1", "--ping-count", "0"],
                "--ping-count 0",
            ),
            (
                vec!["--ping", "10.0.0.1", "--ping-interval", "0"],
                "--ping-interval",
            ),
            (
                vec!["--ping", "10.0.0.1", "--ping-interval", "-1"],
                "--ping-interval",
            ),
        ] {
            let e = with(&extra).unwrap_err().to_string();
            assert!(e.contains(needle), "{extra:?}: {e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        for (flags, needle) in [
            (vec!["--lcores", "0"], "--ip is required"),
            (vec!["--ip", "10.0.0.2", "--lcores", "0"], "prefix length"),
            (
                vec!["--ip", "10.0.0.2/33", "--lcores", "0"],
                "prefix length",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--gateway", "x"],
                "--gateway",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--mac", "zz"],
                "--mac",
            ),
            (
                vec![
                    "--ip",
                    "10.0.0.2/24",
                    "--lcores",
                    "0",
                    "--neighbour",
                    "1.2.3.4",
                ],
                "IP=MAC",
            ),
            (
                vec![
                    "--ip",
                    "10.0.0.2/24",
                    "--lcores",
                    "0",
                    "--steering",
                    "magic",
                ],
                "--steering",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--idle", "lazy"],
                "--idle",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--udp-echo", "0"],
                "--udp-echo",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--duration=-1"],
                "--duration",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--lcores", "0", "--duration", "1e30"],
                "--duration",
            ),
            (
                vec![
                    "--ip",
                    "10.0.0.2/24",
                    "--lcores",
                    "0",
                    "--mbufs",
                    "4294967295",
                ],
                "--mbufs",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--udp-echo", "7", "--udp-echo", "7"],
                "--udp-echo 7 is given twice",
            ),
            (
                vec!["--ip", "10.0.0.2/24", "--mac", "00:00:00:00:00:00"],
                "all-zero MAC",
            ),
            (
                vec![
                    "--ip",
                    "10.0.0.2/24",
                    "--lcores",
                    "0",
                    "--stats-period",
                    "NaN",
                ],
                "--stats-period",
            ),
        ] {
            let e = plan(&args(&flags)).unwrap_err().to_string();
            assert!(e.contains(needle), "{flags:?}: {e}");
        }
    }
}
