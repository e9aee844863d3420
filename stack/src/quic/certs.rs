//! The cluster's certificates: one CA per cluster, one certificate per node
//! signed by it. Every connection is mutual TLS against that CA, so a peer
//! proves membership by presenting a node certificate.
//!
//! Files in a cluster directory (PEM):
//! - `ca.pem`, `ca.key`: the CA (keep `ca.key` off the nodes);
//! - `NODE.pem`, `NODE.key`: a node's certificate chain and private key.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "node name {0:?} is not usable as a file name and DNS name (use letters, digits, '-', '.')"
    )]
    BadName(String),
    #[error("{0} has no CA: run `ainftp-dp certs --dir {0} --ca` first")]
    NoCa(String),
}

/// Where a node finds its identity and the CA to check peers against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl NodeFiles {
    /// The files of node `name` in cluster directory `dir`.
    pub fn in_dir(dir: &Path, name: &str) -> NodeFiles {
        NodeFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Write `contents` to a new file at `path`; private keys are readable by
/// the owner only. An existing file (or a link planted in its place) is an
/// error, never overwritten: a CA or key replaced by mistake cuts a node
/// off its cluster, and the mode is only applied to files we create.
fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(contents.as_bytes()).map_err(io_err(path))
}

/// Writes a certificate and its key, neither if either file exists: a
/// new certificate beside an old key (or the reverse) is a broken pair.
fn write_pair(cert: &Path, cert_pem: &str, key: &Path, key_pem: &str) -> Result<(), CertError> {
    if let Some(taken) = [cert, key].into_iter().find(|p| p.exists()) {
        return Err(CertError::Io {
            path: taken.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    write_file(cert, cert_pem, false)?;
    write_file(key, key_pem, true)
}

/// Whether `name` can be a node's file name and DNS name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
}

/// Create a new cluster CA in `dir` (created if missing), named `cluster`.
pub fn create_ca(dir: &Path, cluster: &str) -> Result<NodeFiles, CertError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("ainftp cluster CA {cluster}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key)?;
    let files = NodeFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("ca.pem"),
        key: dir.join("ca.key"),
    };
    write_pair(&files.ca, &cert.pem(), &files.key, &key.serialize_pem())?;
    Ok(files)
}

/// Issue a certificate for node `name` from the CA in `dir`. The name is
/// the certificate's DNS name (clients verify the server against it) and
/// its file name.
pub fn issue_node(dir: &Path, name: &str) -> Result<NodeFiles, CertError> {
    if !valid_name(name) {
        return Err(CertError::BadName(name.to_owned()));
    }
    let ca_pem_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca.key");
    if !ca_pem_path.exists() || !ca_key_path.exists() {
        return Err(CertError::NoCa(dir.display().to_string()));
    }
    let ca_pem = fs::read_to_string(&ca_pem_path).map_err(io_err(&ca_pem_path))?;
    let ca_key_pem = fs::read_to_string(&ca_key_path).map_err(io_err(&ca_key_path))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![name.to_owned()])?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    // Every node is both a server and a client of its peers.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &issuer)?;
    let files = NodeFiles::in_dir(dir, name);
    write_pair(&files.cert, &cert.pem(), &files.key, &key.serialize_pem())?;
    Ok(files)
}

/// The DNS names a certificate (DER) was issued for: its subjectAltName
/// dNSName entries. A node certificate names its node (`issue_node`), so
/// this is who a verified peer is. Empty when it names none or does not
/// parse.
pub fn dns_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(name) => Some((*name).to_owned()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_files_or_dns_names_are_refused() {
        for bad in ["", "../x", "a/b", "-a", ".a", "a b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        for good in ["node0", "rank-3", "n1.cluster"] {
            assert!(valid_name(good), "{good:?}");
        }
    }

    #[test]
    fn issuing_without_a_ca_names_the_fix() {
        let dir = std::env::temp_dir().join(format!("ainftp-noca-{}", std::process::id()));
        let err = issue_node(&dir, "node0").unwrap_err();
        assert!(err.to_string().contains("--ca"), "{err}");
    }

    #[test]
    fn node_certificates_are_signed_by_the_cluster_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        create_ca(&dir, "test").unwrap();
        let node = issue_node(&dir, "node0").unwrap();
        let ca_pem = fs::read_to_string(dir.join("ca.pem")).unwrap();
        let node_pem = fs::read_to_string(&node.cert).unwrap();
        assert!(ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(node_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let key_mode = {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(&node.key).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(key_mode, 0o600);
        // The chain verifies for real in the QUIC handshake tests.
        // Files are never written over: a second CA in the same place fails,
        // and so does one where only the key is (no new ca.pem beside it).
        let err = create_ca(&dir, "again").unwrap_err();
        assert!(err.to_string().contains("exists"), "{err}");
        assert_eq!(fs::read_to_string(dir.join("ca.pem")).unwrap(), ca_pem);
        fs::remove_file(dir.join("ca.pem")).unwrap();
        let err = create_ca(&dir, "again").unwrap_err();
        assert!(err.to_string().contains("ca.key"), "{err}");
        assert!(!dir.join("ca.pem").exists());
    }

    #[test]
    fn a_node_certificate_names_its_node_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        create_ca(dir.path(), "test").unwrap();
        let der = |path: &Path| {
            let pem = fs::read(path).unwrap();
            let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
            pem.contents
        };
        let node = issue_node(dir.path(), "rank3").unwrap();
        assert_eq!(dns_names(&der(&node.cert)), ["rank3"]);
        // The CA names no DNS name; junk and a truncated certificate none.
        assert!(dns_names(&der(&dir.path().join("ca.pem"))).is_empty());
        let node_der = der(&node.cert);
        assert!(dns_names(&node_der[..node_der.len() / 2]).is_empty());
        assert!(dns_names(b"not a certificate").is_empty());
    }
}
