//! A throw-away TLS identity for ranks that were given none: QUIC needs a
//! certificate on the accepting side even when peers are not verified.

use stack::quic::certs::{create_ca, issue_node};
use stack::quic::{QuicConfig, Trust};
use tempfile::TempDir;

use super::mesh::node_name;
use crate::error::{Error, Result};

/// `base` with a fresh self-signed identity and no peer verification
/// (peers are the addresses the caller supplied; use
/// `QuicConfig::cluster_node` with rank R's node `node_name(R)` in
/// `DriverConfig::quic` for mutual TLS).
/// The files live in the returned directory, removed when it is dropped:
/// keep it until the endpoint has loaded them.
pub fn ephemeral(rank: usize, base: QuicConfig) -> Result<(QuicConfig, TempDir)> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("ainftp-rank{rank}-"))
        .tempdir()
        .map_err(|e| Error::Transport(format!("creating a directory for a TLS identity: {e}")))?;
    let cert_err = |e: stack::quic::certs::CertError| {
        Error::Transport(format!(
            "creating a TLS identity in {}: {e}",
            dir.path().display()
        ))
    };
    create_ca(dir.path(), "ephemeral").map_err(cert_err)?;
    let files = issue_node(dir.path(), &node_name(rank)).map_err(cert_err)?;
    let cfg = QuicConfig {
        cert_chain: Some(files.cert),
        private_key: Some(files.key),
        trust: Trust::InsecureNoVerify,
        ..base
    };
    Ok((cfg, dir))
}
