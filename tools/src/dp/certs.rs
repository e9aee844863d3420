//! `ainftp-dp certs`: the cluster's certificates. One CA per cluster, one
//! certificate per node; every QUIC connection between nodes is mutual TLS
//! against the CA, so only nodes holding a certificate from it get in.

use std::path::PathBuf;

use clap::Parser;
use stack::quic::certs::{create_ca, issue_node, valid_name, CertError};

/// Create a cluster CA and node certificates (PEM files in --dir).
#[derive(Debug, Parser)]
#[command(
    name = "ainftp-dp certs",
    bin_name = "ainftp-dp certs",
    after_help = "Examples:\n  \
ainftp-dp certs --dir /etc/ainftp --ca --node node0 --node node1   # new cluster, two nodes\n  \
ainftp-dp certs --dir /etc/ainftp --node node2                     # one more node, same CA\n\n\
Files: ca.pem (give to every node), ca.key (keep it off the nodes), NODE.pem + NODE.key (node NODE)."
)]
pub struct CertsArgs {
    /// Directory of the cluster's files (created if missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Create a new CA (refused if the directory already has one).
    #[arg(long)]
    pub ca: bool,

    /// Name of the cluster, written into the CA's subject.
    #[arg(long, default_value = "ainftp")]
    pub cluster: String,

    /// Issue a certificate for this node name (repeatable). Peers check a
    /// server against this name.
    #[arg(long = "node", value_name = "NAME")]
    pub nodes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("{0} already has a CA ({1}): refusing to replace it; use another --dir")]
    CaExists(String, &'static str),
    #[error("nothing to do: give --ca and/or --node NAME")]
    NothingToDo,
    #[error("--dir {0} exists and is not a directory")]
    NotADirectory(String),
    #[error("node name \"ca\" would write over the CA's own files (ca.pem, ca.key): pick another")]
    ReservedName,
    #[error("--node {0} is given twice")]
    NodeTwice(String),
    #[error("node {node} already has a certificate or key in {dir}: refusing to replace it; remove {node}.pem and {node}.key to issue it again")]
    NodeExists { node: String, dir: String },
}

/// Run the subcommand; returns the lines to print.
pub fn run(args: &CertsArgs) -> Result<Vec<String>, CertsError> {
    if !args.ca && args.nodes.is_empty() {
        return Err(CertsError::NothingToDo);
    }
    // Everything is checked before anything is written, so a refused run
    // leaves the directory as it was.
    if args.dir.exists() && !args.dir.is_dir() {
        return Err(CertsError::NotADirectory(args.dir.display().to_string()));
    }
    if let Some(bad) = args.nodes.iter().find(|n| !valid_name(n)) {
        return Err(CertError::BadName(bad.clone()).into());
    }
    if args.nodes.iter().any(|n| n == "ca") {
        return Err(CertsError::ReservedName);
    }
    if let Some(twice) = args
        .nodes
        .iter()
        .enumerate()
        .find_map(|(i, n)| args.nodes[..i].contains(n).then_some(n))
    {
        return Err(CertsError::NodeTwice(twice.clone()));
    }
    // A node's directory holds ca.pem without ca.key: either file means
    // a CA, and replacing ca.pem would make the node refuse every peer.
    if args.ca {
        if let Some(f) = ["ca.key", "ca.pem"]
            .into_iter()
            .find(|f| args.dir.join(f).exists())
        {
            return Err(CertsError::CaExists(args.dir.display().to_string(), f));
        }
    }
    if let Some(node) = args.nodes.iter().find(|n| {
        ["key", "pem"]
            .iter()
            .any(|ext| args.dir.join(format!("{n}.{ext}")).exists())
    }) {
        return Err(CertsError::NodeExists {
            node: node.clone(),
            dir: args.dir.display().to_string(),
        });
    }
    let mut said = Vec::new();
    if args.ca {
        let files = create_ca(&args.dir, &args.cluster)?;
        said.push(format!(
            "CA: {} (key {})",
            files.ca.display(),
            files.key.display()
        ));
    }
    for node in &args.nodes {
        let files = issue_node(&args.dir, node)?;
        said.push(format!(
            "node {node}: {} (key {})",
            files.cert.display(),
            files.key.display()
        ));
    }
    Ok(said)
}
