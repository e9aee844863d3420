//! An Ethernet port: found or created (vdev / PCI hotplug), configured with
//! N queues, RSS and checksum offloads where the PMD has them, started, and
//! stopped and closed on drop.

use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::eal::Eal;
use crate::error::{dpdk, Error, Result};
use crate::extmem::DmaMap;
use crate::mempool::Mempool;
use crate::queue::{RxQueue, TxQueue};
use crate::sys;

/// How to set a port up. `Default` gives one queue pair, the PMD's preferred
/// ring sizes, RSS and checksum offloads where offered, promiscuous mode on.
#[derive(Debug, Clone)]
pub struct PortConfig {
    pub rx_queues: u16,
    pub tx_queues: u16,
    /// Descriptors per queue; 0: the PMD's preferred size (ethdev falls
    /// back to 512), which is what testpmd uses. Some PMDs (memif) stall
    /// with sizes they do not expect.
    pub rx_descriptors: u16,
    pub tx_descriptors: u16,
    /// Spread IPv4/UDP flows over the rx queues by hash (when > 1 queue).
    pub rss: bool,
    /// The RSS hash key (the PMD's default when None). Its length must be
    /// the device's `hash_key_size`.
    pub rss_key: Option<Vec<u8>>,
    /// Let the NIC compute IPv4/UDP checksums when it can.
    pub checksum_offload: bool,
    pub mtu: Option<u16>,
    pub promiscuous: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_descriptors: 0,
            tx_descriptors: 0,
            rss: true,
            rss_key: None,
            checksum_offload: true,
            mtu: None,
            promiscuous: true,
        }
    }
}

/// What the PMD says about the device.
#[derive(Debug, Clone)]
pub struct PortInfo {
    pub id: u16,
    pub name: String,
    pub driver: String,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub rx_offload_capa: u64,
    pub tx_offload_capa: u64,
    pub rss_offloads: u64,
    /// Entries of the RSS redirection table (0: no RSS).
    pub reta_size: u16,
    pub hash_key_size: u8,
    pub min_mtu: u16,
    pub max_mtu: u16,
    pub socket: i32,
}

/// What the port was set up with, after matching the config to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortFeatures {
    pub rx_queues: u16,
    pub tx_queues: u16,
    /// RSS hash functions enabled (0: no RSS).
    pub rss_hf: u64,
    pub tx_ip_checksum: bool,
    pub tx_udp_checksum: bool,
    /// The NIC verifies these on receive and says so in the mbuf flags.
    pub rx_ip_checksum: bool,
    pub rx_udp_checksum: bool,
    pub mtu: u16,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Dropped by the NIC because no rx descriptor was free.
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_nombuf: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStatus {
    pub up: bool,
    pub speed_mbps: u32,
}

#[derive(Clone)]
pub struct Port {
    inner: Arc<PortInner>,
}

struct PortInner {
    id: u16,
    name: String,
    /// The bus we hot-plugged the device on, to unplug it on drop.
    hotplugged_on: Option<&'static str>,
    info: PortInfo,
    features: PortFeatures,
    taken_rx: Mutex<Vec<bool>>,
    taken_tx: Mutex<Vec<bool>>,
    /// The device's DMA mapping of the pool's external memory, released
    /// after the device stops and before it closes.
    dma: Option<DmaMap>,
    // Dropped after the port is closed (field order): rx rings hold mbufs
    // of this pool until then.
    _pool: Mempool,
    _eal: Eal,
    _claim: OpenClaim,
}

impl Port {
    /// Open `dev` and start it. `dev` is a port name that EAL already probed
    /// (e.g. from `-a` or `--vdev`), a vdev spec to create
    /// (`net_null0`, `net_tap0,iface=tap0`, `net_af_xdp0,iface=veth0`), or a
    /// PCI address to hot-plug. Received packets go into `pool`.
    pub fn open(eal: &Eal, dev: &str, cfg: &PortConfig, pool: &Mempool) -> Result<Port> {
        let name = dev.split(',').next().unwrap_or(dev).to_owned();
        let (id, hotplugged_on) = match port_by_name(&name) {
            Some(id) => (id, None),
            None => (hotplug(dev, &name)?, Some(bus_of(&name))),
        };
        // Before the guard: a refused second open must not close the port
        // under its first owner's queues.
        let claim = OpenClaim::take(id, &name)?;
        let guard = CloseOnError {
            id,
            name: &name,
            hotplugged_on,
        };
        let info = port_info(id, &name)?;
        // A NIC behind an IOMMU may only write where it has a mapping, so
        // the pool's external memory is mapped before any rx descriptor
        // points into it. Declared after `guard`: dropped (unmapped) first.
        let dma = match pool.external_memory() {
            Some(ext) => Some(ext.dma_map(device_of(id)?, id)?),
            None => None,
        };
        let features = configure(&info, cfg, pool)?;
        // SAFETY: the port is configured with its queues set up.
        let rc = unsafe { sys::rte_eth_dev_start(id) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_start", rc));
        }
        // After start: some PMDs program the configured key only then.
        if let (Some(key), true) = (&cfg.rss_key, features.rss_hf != 0) {
            if let Err(e) = ensure_rss_key(id, &info, key, features.rss_hf) {
                // SAFETY: valid, started port. Stopped here so that the
                // device no longer writes into the pool before its DMA
                // mapping (`dma`) and the port (`guard`) go.
                unsafe { sys::rte_eth_dev_stop(id) };
                return Err(e);
            }
        }
        std::mem::forget(guard);
        tracing::info!(port = id, %name, driver = %info.driver, ?features, "port started");
        Ok(Port {
            inner: Arc::new(PortInner {
                id,
                name,
                hotplugged_on,
                taken_rx: Mutex::new(vec![false; features.rx_queues as usize]),
                taken_tx: Mutex::new(vec![false; features.tx_queues as usize]),
                info,
                features,
                dma,
                _pool: pool.clone(),
                _eal: eal.clone(),
                _claim: claim,
            }),
        })
    }

    pub fn id(&self) -> u16 {
        self.inner.id
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn info(&self) -> &PortInfo {
        &self.inner.info
    }

    pub fn features(&self) -> PortFeatures {
        self.inner.features
    }

    /// Take receive queue `q`; each queue has one holder at a time (one
    /// lcore), and is given back when its `RxQueue` drops.
    pub fn rx_queue(&self, q: u16) -> Result<RxQueue> {
        take(&self.inner.taken_rx, q, "rx", &self.inner.name)?;
        Ok(RxQueue::new(self.clone(), q))
    }

    /// Take transmit queue `q`; each queue has one holder at a time (one
    /// lcore), and is given back when its `TxQueue` drops.
    pub fn tx_queue(&self, q: u16) -> Result<TxQueue> {
        take(&self.inner.taken_tx, q, "tx", &self.inner.name)?;
        Ok(TxQueue::new(self.clone(), q))
    }

    /// IOVA runs of the pool's external memory mapped for this device:
    /// None when the pool is on DPDK's heap, Some(0) when the bus needs no
    /// mapping.
    pub fn dma_mapped_runs(&self) -> Option<usize> {
        self.inner.dma.as_ref().map(|d| d.runs())
    }

    pub fn mac(&self) -> [u8; 6] {
        let mut addr = sys::rte_ether_addr::default();
        // SAFETY: the port id is valid; addr is a valid out-pointer.
        unsafe { sys::rte_eth_macaddr_get(self.inner.id, &mut addr) };
        addr.addr_bytes
    }

    pub fn link(&self) -> LinkStatus {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: valid port id and out-pointer.
        unsafe { sys::rte_eth_link_get_nowait(self.inner.id, &mut link) };
        // SAFETY: reading an exported constant.
        let up_value = unsafe { sys::AINFTP_ETH_LINK_UP };
        LinkStatus {
            up: link.link_status() as u32 == up_value,
            speed_mbps: link.link_speed,
        }
    }

    pub fn stats(&self) -> Result<PortStats> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port id and out-pointer.
        let rc = unsafe { sys::rte_eth_stats_get(self.inner.id, &mut s) };
        if rc < 0 {
            return Err(dpdk("rte_eth_stats_get", rc));
        }
        Ok(PortStats {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_bytes: s.ibytes,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// The Toeplitz key the device hashes flows with, as the PMD reports it
    /// (an error where the PMD cannot say).
    pub fn rss_key(&self) -> Result<Vec<u8>> {
        read_rss_key(self.inner.id, self.inner.info.hash_key_size)
    }

    /// The RSS redirection table: entry i names the rx queue of the
    /// hashes h with h % len == i (an error where the PMD has none).
    pub fn rss_reta(&self) -> Result<Vec<u16>> {
        let size = self.reta_size()?;
        let mut conf = reta_groups(size, &[]);
        // SAFETY: valid port id; `conf` holds reta_size / 64 (rounded up)
        // entries, each asking for all 64 of its slots.
        let rc = unsafe { sys::rte_eth_dev_rss_reta_query(self.inner.id, conf.as_mut_ptr(), size) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_rss_reta_query", rc));
        }
        Ok(conf
            .iter()
            .flat_map(|g| g.reta)
            .take(size as usize)
            .collect())
    }

    /// Program the whole redirection table (`reta.len()` must be the
    /// device's `reta_size`).
    pub fn set_rss_reta(&self, reta: &[u16]) -> Result<()> {
        let size = self.reta_size()?;
        if reta.len() != size as usize {
            return Err(Error::Port(format!(
                "port {} has {size} redirection entries; {} given",
                self.inner.name,
                reta.len()
            )));
        }
        let mut conf = reta_groups(size, reta);
        // SAFETY: valid port id; `conf` holds every entry of the table.
        let rc =
            unsafe { sys::rte_eth_dev_rss_reta_update(self.inner.id, conf.as_mut_ptr(), size) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_rss_reta_update", rc));
        }
        Ok(())
    }

    fn reta_size(&self) -> Result<u16> {
        match self.inner.info.reta_size {
            0 => Err(Error::Port(format!(
                "port {} ({}) has no RSS redirection table",
                self.inner.name, self.inner.info.driver
            ))),
            n => Ok(n),
        }
    }

    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: valid port id.
        let rc = unsafe { sys::rte_eth_stats_reset(self.inner.id) };
        if rc < 0 {
            return Err(dpdk("rte_eth_stats_reset", rc));
        }
        Ok(())
    }

    /// The driver's extended statistics, by name.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        let id = self.inner.id;
        // SAFETY: a NULL array with size 0 asks for the count.
        let n = unsafe { sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(dpdk("rte_eth_xstats_get_names", n));
        }
        let mut names = vec![sys::rte_eth_xstat_name::default(); n as usize];
        let mut values = vec![sys::rte_eth_xstat::default(); n as usize];
        // SAFETY: both arrays hold n entries.
        let got_names = unsafe { sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), n as u32) };
        // SAFETY: as above.
        let got = unsafe { sys::rte_eth_xstats_get(id, values.as_mut_ptr(), n as u32) };
        if got_names < 0 || got < 0 {
            return Err(dpdk("rte_eth_xstats_get", got.min(got_names)));
        }
        let count = (got.min(got_names)) as usize;
        Ok(values[..count]
            .iter()
            .filter_map(|v| {
                let name = names.get(v.id as usize)?;
                // SAFETY: DPDK NUL-terminates xstat names within the array.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) };
                Some((s.to_string_lossy().into_owned(), v.value))
            })
            .collect())
    }

    /// Stops the device. Refused while any of its queues is taken: DPDK's
    /// control path is not safe against a burst running on another lcore
    /// (a PMD frees its rings' mbufs on stop). Queues may be taken while
    /// it is stopped; their bursts then move nothing.
    pub fn stop(&self) -> Result<()> {
        let _quiet = self.no_queue_taken("stop")?;
        // SAFETY: valid port id; stopping a stopped port is harmless; no
        // queue is taken, and none can be until the guards drop.
        let rc = unsafe { sys::rte_eth_dev_stop(self.inner.id) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_stop", rc));
        }
        Ok(())
    }

    /// Starts the device again after `stop`; refused while any of its
    /// queues is taken, as `stop` is.
    pub fn start(&self) -> Result<()> {
        let _quiet = self.no_queue_taken("start")?;
        // SAFETY: valid, configured port id; no queue is taken.
        let rc = unsafe { sys::rte_eth_dev_start(self.inner.id) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_start", rc));
        }
        Ok(())
    }

    /// Both queue tables, locked, if no queue is taken: no burst can run
    /// while they are held.
    fn no_queue_taken(&self, what: &str) -> Result<[MutexGuard<'_, Vec<bool>>; 2]> {
        let guards = [&self.inner.taken_rx, &self.inner.taken_tx]
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        let held = guards
            .iter()
            .map(|g| g.iter().filter(|&&t| t).count())
            .sum::<usize>();
        if held > 0 {
            return Err(Error::Port(format!(
                "cannot {what} port {} while {held} of its queues are taken: drop them first",
                self.inner.name
            )));
        }
        Ok(guards)
    }

    /// Gives queue `q` back (its `RxQueue` or `TxQueue` dropped).
    pub(crate) fn give_back(&self, rx: bool, q: u16) {
        let taken = if rx {
            &self.inner.taken_rx
        } else {
            &self.inner.taken_tx
        };
        let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = taken.get_mut(q as usize) {
            *slot = false;
        }
    }
}

impl Drop for PortInner {
    fn drop(&mut self) {
        if let Some(dma) = self.dma.take() {
            // SAFETY: valid port id; the device stops writing into the
            // mapped memory before the mapping goes.
            unsafe { sys::rte_eth_dev_stop(self.id) };
            drop(dma);
        }
        close_port(self.id, &self.name, self.hotplugged_on);
    }
}

/// Ports this process has open. Opening one again would reconfigure it
/// under its live queues, fail with EBUSY, and close it on the way out.
static OPEN_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// This process's hold on a port id, released on drop (after the port is
/// closed: it is the last field of `PortInner`).
struct OpenClaim(u16);

impl OpenClaim {
    fn take(id: u16, name: &str) -> Result<OpenClaim> {
        let mut open = OPEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        if open.contains(&id) {
            return Err(Error::Port(format!(
                "port {name} is already open in this process: open it once and share the Port"
            )));
        }
        open.push(id);
        Ok(OpenClaim(id))
    }
}

impl Drop for OpenClaim {
    fn drop(&mut self) {
        let mut open = OPEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|&id| id != self.0);
    }
}

/// Undoes a half-opened port if configuration fails: a device we
/// hot-plugged is closed and unplugged (the next open plugs it again); one
/// EAL probed (`-a`, `--vdev`) is only stopped, since a closed ethdev is
/// gone for the rest of the process and the next open (with fewer queues,
/// say) could no longer find it.
struct CloseOnError<'a> {
    id: u16,
    name: &'a str,
    hotplugged_on: Option<&'static str>,
}

impl Drop for CloseOnError<'_> {
    fn drop(&mut self) {
        match self.hotplugged_on {
            Some(_) => close_port(self.id, self.name, self.hotplugged_on),
            // SAFETY: valid port id, no queue handed out; stopping a port
            // that never started is harmless. A later open reconfigures it.
            None => unsafe {
                sys::rte_eth_dev_stop(self.id);
            },
        }
    }
}

fn close_port(id: u16, name: &str, hotplugged_on: Option<&'static str>) {
    // SAFETY: valid port id; no queue handle is left (they hold the Arc).
    unsafe {
        sys::rte_eth_dev_stop(id);
        sys::rte_eth_dev_close(id);
    }
    if let (Some(bus), Ok(cname)) = (hotplugged_on, CString::new(name)) {
        let cbus = CString::new(bus).unwrap();
        // SAFETY: both are valid C strings; the device is closed.
        unsafe { sys::rte_eal_hotplug_remove(cbus.as_ptr(), cname.as_ptr()) };
    }
}

/// The port's rte_device, for bus-level calls (DMA mapping).
fn device_of(id: u16) -> Result<*mut sys::rte_device> {
    let mut di = sys::rte_eth_dev_info::default();
    // SAFETY: valid port id and out-pointer.
    let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut di) };
    if rc < 0 {
        return Err(dpdk("rte_eth_dev_info_get", rc));
    }
    Ok(di.device)
}

fn take(taken: &Mutex<Vec<bool>>, q: u16, dir: &str, port: &str) -> Result<()> {
    let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
    let n = taken.len();
    match taken.get_mut(q as usize) {
        None => Err(Error::Port(format!(
            "port {port} has {n} {dir} queues; queue {q} does not exist"
        ))),
        Some(true) => Err(Error::Port(format!(
            "{dir} queue {q} of port {port} is already taken by another lcore"
        ))),
        Some(slot) => {
            *slot = true;
            Ok(())
        }
    }
}

fn port_by_name(name: &str) -> Option<u16> {
    let cname = CString::new(name).ok()?;
    let mut id = 0u16;
    // SAFETY: valid C string and out-pointer.
    let rc = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) };
    (rc == 0).then_some(id)
}

fn bus_of(name: &str) -> &'static str {
    if looks_like_pci(name) {
        "pci"
    } else {
        "vdev"
    }
}

fn looks_like_pci(name: &str) -> bool {
    let b = name.as_bytes();
    // dddd:bb:dd.f or bb:dd.f
    let short = b.len() == 7 && b[2] == b':' && b[5] == b'.';
    let long = b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.';
    (short || long)
        && name
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
}

/// The key port `id` hashes with (`size` as its PMD reports, 0 if not).
fn read_rss_key(id: u16, size: u8) -> Result<Vec<u8>> {
    let mut key = vec![0u8; size.max(40) as usize];
    let mut conf = sys::rte_eth_rss_conf {
        rss_key: key.as_mut_ptr(),
        rss_key_len: key.len() as u8,
        rss_hf: 0,
    };
    // SAFETY: valid port id; `key` holds rss_key_len bytes for the PMD
    // to fill and outlives the call.
    let rc = unsafe { sys::rte_eth_dev_rss_hash_conf_get(id, &mut conf) };
    if rc < 0 {
        return Err(dpdk("rte_eth_dev_rss_hash_conf_get", rc));
    }
    key.truncate(conf.rss_key_len as usize);
    Ok(key)
}

/// Some PMDs ignore the key given at configure (net_null keeps its
/// default): read it back, set it again through the hash update call if
/// it did not take, and fail rather than hash with a key nobody asked for.
/// A PMD that cannot report its key is trusted with it.
fn ensure_rss_key(id: u16, info: &PortInfo, key: &[u8], rss_hf: u64) -> Result<()> {
    let Ok(now) = read_rss_key(id, info.hash_key_size) else {
        return Ok(());
    };
    if now == key {
        return Ok(());
    }
    let mut wanted = key.to_vec();
    let mut conf = sys::rte_eth_rss_conf {
        rss_key: wanted.as_mut_ptr(),
        rss_key_len: wanted.len() as u8,
        rss_hf,
    };
    // SAFETY: valid port id; `wanted` holds rss_key_len bytes and outlives
    // the call (the PMD copies them).
    let rc = unsafe { sys::rte_eth_dev_rss_hash_update(id, &mut conf) };
    if rc >= 0 && read_rss_key(id, info.hash_key_size).is_ok_and(|k| k == key) {
        return Ok(());
    }
    Err(Error::Port(format!(
        "port {} ({}) did not take the RSS key it was given{}",
        info.name,
        info.driver,
        match rc < 0 {
            true => format!(": {}", dpdk("rte_eth_dev_rss_hash_update", rc)),
            false => String::new(),
        }
    )))
}

fn hotplug(dev: &str, name: &str) -> Result<u16> {
    let cdev = CString::new(dev)
        .map_err(|_| Error::InvalidArgument(format!("device spec {dev:?} has a NUL")))?;
    // SAFETY: valid C string; EAL is initialised (the caller holds an Eal).
    let rc = unsafe { sys::rte_dev_probe(cdev.as_ptr()) };
    let hint = if looks_like_pci(name) {
        "is it bound to vfio-pci or uio_pci_generic (dpdk-devbind.py --status)?"
    } else if name.starts_with("net_") {
        "check the vdev arguments (e.g. net_null0, net_tap0,iface=dtap0, net_af_xdp0,iface=veth0)"
    } else {
        "give a PCI address (0000:3b:00.0) or a vdev spec starting with a driver name (net_null0, net_tap0, ...)"
    };
    if rc < 0 {
        return Err(Error::Port(format!(
            "cannot open device '{dev}': {} (rte_errno {}); {hint}",
            crate::error::strerror(-rc),
            -rc
        )));
    }
    port_by_name(name).ok_or_else(|| {
        Error::Port(format!(
            "device '{dev}' was probed but is not an Ethernet port; {hint}"
        ))
    })
}

fn port_info(id: u16, name: &str) -> Result<PortInfo> {
    let mut di = sys::rte_eth_dev_info::default();
    // SAFETY: valid port id and out-pointer.
    let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut di) };
    if rc < 0 {
        return Err(dpdk("rte_eth_dev_info_get", rc));
    }
    let driver = if di.driver_name.is_null() {
        String::new()
    } else {
        // SAFETY: driver_name is a static string owned by the PMD.
        unsafe { CStr::from_ptr(di.driver_name) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: valid port id.
    let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
    Ok(PortInfo {
        id,
        name: name.to_owned(),
        driver,
        max_rx_queues: di.max_rx_queues,
        max_tx_queues: di.max_tx_queues,
        rx_offload_capa: di.rx_offload_capa,
        tx_offload_capa: di.tx_offload_capa,
        rss_offloads: di.flow_type_rss_offloads,
        reta_size: di.reta_size,
        hash_key_size: di.hash_key_size,
        min_mtu: di.min_mtu,
        max_mtu: di.max_mtu,
        socket,
    })
}

/// ethdev's redirection table layout: groups of 64 entries, all selected,
/// filled from `entries` (zeros past its end).
fn reta_groups(size: u16, entries: &[u16]) -> Vec<sys::rte_eth_rss_reta_entry64> {
    let mut groups = vec![
        sys::rte_eth_rss_reta_entry64 {
            mask: u64::MAX,
            reta: [0; 64],
        };
        (size as usize).div_ceil(64)
    ];
    for (i, &q) in entries.iter().enumerate() {
        groups[i / 64].reta[i % 64] = q;
    }
    groups
}

fn configure(info: &PortInfo, cfg: &PortConfig, pool: &Mempool) -> Result<PortFeatures> {
    let name = &info.name;
    for (dir, asked, max) in [
        ("rx", cfg.rx_queues, info.max_rx_queues),
        ("tx", cfg.tx_queues, info.max_tx_queues),
    ] {
        if asked == 0 || asked > max {
            return Err(Error::Port(format!(
                "port {name} ({}) supports 1 to {max} {dir} queues; {asked} asked",
                info.driver
            )));
        }
    }
    if let Some(mtu) = cfg.mtu {
        if mtu < info.min_mtu || mtu > info.max_mtu {
            return Err(Error::Port(format!(
                "port {name} supports an MTU of {} to {}; {mtu} asked",
                info.min_mtu, info.max_mtu
            )));
        }
    }

    // SAFETY: reading constants exported by the shim.
    let (rss_want, mq_rss, tx_ip, tx_udp, rx_rss_hash, rx_ip, rx_udp) = unsafe {
        (
            sys::AINFTP_ETH_RSS_IPV4 | sys::AINFTP_ETH_RSS_NONFRAG_IPV4_UDP,
            sys::AINFTP_ETH_MQ_RX_RSS,
            sys::AINFTP_ETH_TX_OFFLOAD_IPV4_CKSUM,
            sys::AINFTP_ETH_TX_OFFLOAD_UDP_CKSUM,
            sys::AINFTP_ETH_RX_OFFLOAD_RSS_HASH,
            sys::AINFTP_ETH_RX_OFFLOAD_IPV4_CKSUM,
            sys::AINFTP_ETH_RX_OFFLOAD_UDP_CKSUM,
        )
    };
    if let Some(key) = &cfg.rss_key {
        // 0: the PMD does not say (net_null, which hashes with a 40-byte
        // key): a Toeplitz key of the usual 40 bytes goes to it, and is
        // read back to see that it took.
        let size = match info.hash_key_size {
            0 => 40,
            n => n as usize,
        };
        if key.len() != size {
            return Err(Error::Port(format!(
                "port {name} ({}) takes an RSS key of {size} bytes; {} given",
                info.driver,
                key.len()
            )));
        }
    }
    let mut conf = sys::rte_eth_conf::default();
    // Without the UDP bit a PMD hashes addresses only (vmxnet3 on some
    // hosts), and the stack's placement, which hashes ports too, would put
    // flows on the wrong lcore: such a port gets no RSS and the stack
    // steers in software.
    // SAFETY: reading a constant exported by the shim.
    let hashes_udp = info.rss_offloads & unsafe { sys::AINFTP_ETH_RSS_NONFRAG_IPV4_UDP } != 0;
    let rss_hf = if cfg.rss && cfg.rx_queues > 1 && hashes_udp {
        info.rss_offloads & rss_want
    } else {
        0
    };
    if rss_hf != 0 {
        conf.rxmode.mq_mode = mq_rss as _;
        conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        if let Some(key) = &cfg.rss_key {
            // The PMD copies the key during configure; `cfg` outlives the call.
            conf.rx_adv_conf.rss_conf.rss_key = key.as_ptr() as *mut u8;
            conf.rx_adv_conf.rss_conf.rss_key_len = key.len() as u8;
        }
        if info.rx_offload_capa & rx_rss_hash != 0 {
            conf.rxmode.offloads |= rx_rss_hash;
        }
    } else if cfg.rss && cfg.rx_queues > 1 {
        // Debug only: the caller decides what to do instead (the stack
        // steers in software) and says so.
        tracing::debug!(port = %name, driver = %info.driver, "PMD has no IPv4/UDP RSS; flows will not be spread by hash");
    }
    let (mut tx_offloads, mut rx_offloads) = (0, 0);
    if cfg.checksum_offload {
        tx_offloads = info.tx_offload_capa & (tx_ip | tx_udp);
        rx_offloads = info.rx_offload_capa & (rx_ip | rx_udp);
    }
    conf.txmode.offloads = tx_offloads;
    conf.rxmode.offloads |= rx_offloads;

    let id = info.id;
    // SAFETY: valid port id; conf is fully initialised.
    let rc = unsafe { sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf) };
    if rc < 0 {
        return Err(dpdk("rte_eth_dev_configure", rc));
    }
    let (mut nb_rxd, mut nb_txd) = (cfg.rx_descriptors, cfg.tx_descriptors);
    if nb_rxd != 0 || nb_txd != 0 {
        // SAFETY: valid port id and out-pointers.
        let rc = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nb_rxd, &mut nb_txd) };
        if rc < 0 {
            return Err(dpdk("rte_eth_dev_adjust_nb_rx_tx_desc", rc));
        }
    }
    let socket = info.socket as u32; // SOCKET_ID_ANY (-1) passes through
    for q in 0..cfg.rx_queues {
        // SAFETY: valid port/queue; NULL rxconf means the PMD's defaults;
        // the pool outlives the port (PortInner keeps it).
        let rc = unsafe {
            sys::rte_eth_rx_queue_setup(id, q, nb_rxd, socket, std::ptr::null(), pool.as_ptr())
        };
        if rc < 0 {
            return Err(dpdk("rte_eth_rx_queue_setup", rc));
        }
    }
    for q in 0..cfg.tx_queues {
        // SAFETY: valid port/queue; NULL txconf means the PMD's defaults.
        let rc = unsafe { sys::rte_eth_tx_queue_setup(id, q, nb_txd, socket, std::ptr::null()) };
        if rc < 0 {
            return Err(dpdk("rte_eth_tx_queue_setup", rc));
        }
    }
    if let Some(mtu) = cfg.mtu {
        // SAFETY: valid port id.
        let rc = unsafe { sys::rte_eth_dev_set_mtu(id, mtu) };
        if rc < 0 {
            return Err(Error::Port(format!(
                "port {name} ({}) cannot set an MTU of {mtu}: {}",
                info.driver,
                dpdk("rte_eth_dev_set_mtu", rc)
            )));
        }
    }
    if cfg.promiscuous {
        // SAFETY: valid port id. Some PMDs (net_null) have no such mode.
        let rc = unsafe { sys::rte_eth_promiscuous_enable(id) };
        if rc < 0 {
            tracing::debug!(port = %name, rc, "promiscuous mode not supported");
        }
    }
    let mut mtu = 0u16;
    // SAFETY: valid port id and out-pointer.
    unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
    Ok(PortFeatures {
        rx_queues: cfg.rx_queues,
        tx_queues: cfg.tx_queues,
        rss_hf,
        tx_ip_checksum: tx_offloads & tx_ip != 0,
        tx_udp_checksum: tx_offloads & tx_udp != 0,
        rx_ip_checksum: rx_offloads & rx_ip != 0,
        rx_udp_checksum: rx_offloads & rx_udp != 0,
        mtu,
    })
}

#[cfg(test)]
mod tests {
    use super::looks_like_pci;

    #[test]
    fn pci_addresses_are_told_from_vdev_names() {
        assert!(looks_like_pci("0000:3b:00.0"));
        assert!(looks_like_pci("3b:00.0"));
        assert!(!looks_like_pci("net_null0"));
        assert!(!looks_like_pci("0000:3b:00"));
        assert!(!looks_like_pci("zzzz:3b:00.0"));
    }
}
