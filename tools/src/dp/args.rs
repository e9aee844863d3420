//! ainftp-dp's command line. Every option can also come from a TOML file
//! (`--config`); flags given on the command line win.

use std::path::PathBuf;

use clap::Parser;

/// The ainftp data-plane appliance: owns a DPDK port, answers ARP and ping
/// on its address, runs UDP services, prints per-lcore statistics, and
/// exits cleanly on SIGINT/SIGTERM.
///
/// Without --pci or --vdev it creates a TAP device (net_tap, kernel side
/// named by --tap-iface) so it runs on any Linux machine as root.
#[derive(Debug, Parser, Default)]
#[command(
    name = "ainftp-dp",
    version,
    // Examples are kept under 80 columns: clap would wrap longer lines
    // mid-command, and copied, they would break.
    after_help = "Examples:\n  \
ainftp-dp --ip 10.0.0.2/24 --udp-echo 7   # on a new TAP device, dtap0; then:\n  \
ip addr add 10.0.0.1/24 dev dtap0; ip link set dtap0 up; ping 10.0.0.2\n  \
ainftp-dp --lcores 2-7 --pci 0000:3b:00.0 --ip 10.0.0.2/24 --gateway 10.0.0.1\n  \
ainftp-dp --vdev net_af_xdp0,iface=veth1 --ip 10.9.0.2/24 --udp-echo 9000\n  \
ainftp-dp --pci 0000:3b:00.0 --ip 10.0.0.2/24 --ping 10.0.0.1 --duration 5\n  \
ainftp-dp --config node.toml --duration 60\n\n\
Subcommand:\n  \
ainftp-dp certs --dir /etc/ainftp --ca --node node0   # see certs --help"
)]
pub struct DpArgs {
    /// TOML file with any of these options (keys as the long flags, with
    /// underscores: ip = "10.0.0.2/24", udp_echo = [7], lcores = "2-7";
    /// but neighbours = [..] for --neighbour, checksum_offload = false for
    /// --no-checksum-offload, eal = [..] for what follows --; not --json).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// CPUs to run on, one poll loop each, e.g. 2-7 or 0,2 [default: the first two CPUs this process may run on].
    #[arg(long, value_name = "LIST")]
    pub lcores: Option<String>,

    /// PCI device to drive, e.g. 0000:3b:00.0 (bound to vfio-pci).
    #[arg(long, value_name = "BDF", conflicts_with = "vdev", value_parser = crate::eal_setup::parse_pci)]
    pub pci: Option<String>,

    /// Virtual device to create, e.g. net_af_xdp0,iface=veth1 or net_tap0,iface=dtap0.
    #[arg(long, value_name = "SPEC")]
    pub vdev: Option<String>,

    /// Kernel-side name of the TAP device used when no --pci/--vdev is given [default: dtap0].
    #[arg(long, value_name = "NAME")]
    pub tap_iface: Option<String>,

    /// Our IPv4 address and prefix, e.g. 10.0.0.2/24.
    #[arg(long, value_name = "ADDR/LEN")]
    pub ip: Option<String>,

    /// Default gateway for destinations outside the subnet.
    #[arg(long, value_name = "ADDR")]
    pub gateway: Option<String>,

    /// Our MAC address [default: the port's].
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,

    /// 802.1Q VLAN id to tag with and accept (1-4094).
    #[arg(long, value_name = "ID")]
    pub vlan: Option<u16>,

    /// Static neighbour, IP=MAC (repeatable): never resolved by ARP.
    #[arg(long = "neighbour", value_name = "IP=MAC")]
    pub neighbours: Vec<String>,

    /// Neighbours learned by ARP that the table holds at once [default:
    /// 4096; at most 16384]. Past it, a new neighbour is resolved for each
    /// burst of packets instead of learned: raise it for a subnet with more
    /// peers.
    #[arg(long, value_name = "N")]
    pub arp_max_entries: Option<usize>,

    /// Seconds a neighbour learned by ARP is trusted before it is asked
    /// for again (it stays in use for 2.5 s more while asked) [default: 60].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub arp_reachable: Option<f64>,

    /// Run a UDP echo service on this port (repeatable).
    #[arg(long = "udp-echo", value_name = "PORT")]
    pub udp_echo: Vec<u16>,

    /// How flows reach the lcores: auto (RSS if the PMD has it, else software), rss, software.
    #[arg(long, value_name = "MODE")]
    pub steering: Option<String>,

    /// Use a symmetric RSS key (both directions of a flow on one lcore);
    /// `--symmetric-rss=false` turns off the config file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub symmetric_rss: Option<bool>,

    /// Idle policy of the poll loops: busy or adaptive [default: busy when every lcore is an
    /// isolated CPU (/sys/devices/system/cpu/isolated), else adaptive].
    #[arg(long, value_name = "POLICY")]
    pub idle: Option<String>,

    /// Port MTU [default: the PMD's].
    #[arg(long)]
    pub mtu: Option<u16>,

    /// Mbufs in the packet pool [default: 8191].
    #[arg(long)]
    pub mbufs: Option<u32>,

    /// Put packet buffers in a hugepage arena registered with DPDK and CUDA
    /// (host-only without a GPU), so payloads land in memory the GPU
    /// reaches. Not with net_af_xdp. `--mbuf-arena=false` turns off the
    /// config file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub mbuf_arena: Option<bool>,

    /// Do not use the NIC's checksum offloads (compute in software).
    #[arg(long, conflicts_with = "checksum_offload")]
    pub no_checksum_offload: bool,

    /// Use the NIC's checksum offloads where it has them [default: true];
    /// `--checksum-offload=true` turns back on what the config file
    /// turned off.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub checksum_offload: Option<bool>,

    /// Impair what we send, for experiments: e.g. loss=0.05,delay=2ms,jitter=1ms,dup=0.01,reorder=0.1,corrupt=0.001,seed=7.
    #[arg(long, value_name = "SPEC")]
    pub impair: Option<String>,

    /// Ping this address from our stack (ICMP echo requests, as `ping`
    /// sends them; through --gateway outside the subnet): each reply is
    /// printed, and the summary counts them.
    #[arg(long, value_name = "ADDR")]
    pub ping: Option<String>,

    /// Echo requests to send with --ping [default: until stopped]. The
    /// appliance runs on after the last (it serves too): stop it with
    /// --duration or a signal; a request sent in the last second before
    /// that counts as in flight, not lost.
    #[arg(long, value_name = "N")]
    pub ping_count: Option<u32>,

    /// Seconds between echo requests with --ping [default: 1].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub ping_interval: Option<f64>,

    /// Seconds between statistics lines; 0: only the final summary [default: 1].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub stats_period: Option<f64>,

    /// Stop after this many seconds; 0: run until SIGINT/SIGTERM [default: 0].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// Print the final summary as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,

    /// Extra EAL arguments, after `--`.
    #[arg(last = true, value_name = "EAL_ARGS")]
    pub eal: Vec<String>,
}
