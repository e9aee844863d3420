//! A throw-away TLS identity for ranks that were given none: QUIC needs a
//! certificate on the accepting side even when peers are not verified.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use stack::quic::certs::{create_ca, issue_node};
use stack::quic::{QuicConfig, Trust};

use super::mesh::SERVER_NAME;
use crate::error::{Error, Result};

/// Removes the identity's files once the endpoint has loaded them.
pub struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `base` with a fresh self-signed identity and no peer verification
/// (peers are the addresses the caller supplied; use
/// `QuicConfig::cluster_node` in `DriverConfig::quic` for mutual TLS).
pub fn ephemeral(rank: usize, base: QuicConfig) -> Result<(QuicConfig, TempDir)> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("ainftp-rank{rank}-{}-{nanos}", std::process::id()));
    let guard = TempDir(dir.clone());
    let cert_err = |e: stack::quic::certs::CertError| {
        Error::Transport(format!("creating a TLS identity in {}: {e}", dir.display()))
    };
    create_ca(&dir, "ephemeral").map_err(cert_err)?;
    let files = issue_node(&dir, SERVER_NAME).map_err(cert_err)?;
    let cfg = QuicConfig {
        cert_chain: Some(files.cert),
        private_key: Some(files.key),
        trust: Trust::InsecureNoVerify,
        ..base
    };
    Ok((cfg, guard))
}
