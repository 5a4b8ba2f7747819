//! Certificates and keys for one control plane, generated at start with rcgen.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The admin identity of the kubeconfig.
pub const ADMIN_USER: &str = "lock-janitor-admin";
/// The user kube-controller-manager acts as (in group system:masters).
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
/// Group of the admin identity (bypasses RBAC).
pub const ADMIN_GROUP: &str = "system:masters";
/// First IP of `--service-cluster-ip-range=10.0.0.0/24`: the `kubernetes` Service.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// PEM encoded material.
pub(crate) struct Pki {
    pub ca_cert: String,
    pub ca_der: Vec<u8>,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    pub kcm_cert: String,
    pub kcm_key: String,
    pub sa_key: String,
    pub sa_pub: String,
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

pub(crate) fn generate() -> Result<Pki, rcgen::Error> {
    // CA
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = dn("lock-janitor-testenv-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);

    // kube-apiserver (and kube-controller-manager) serving certificate.
    let serving_key = KeyPair::generate()?;
    let mut sp = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])?;
    sp.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    sp.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(KUBERNETES_SERVICE_IP)));
    sp.distinguished_name = dn("kube-apiserver", None);
    sp.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    sp.use_authority_key_identifier_extension = true;
    let serving_cert = sp.signed_by(&serving_key, &ca)?;

    // Client certificates: CN is the user, O the group.
    let client = |user: &str| -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name = dn(user, Some(ADMIN_GROUP));
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.use_authority_key_identifier_extension = true;
        Ok((p.signed_by(&key, &ca)?.pem(), key.serialize_pem()))
    };
    let (admin_cert, admin_key) = client(ADMIN_USER)?;
    let (kcm_cert, kcm_key) = client(CONTROLLER_MANAGER_USER)?;

    // Service-account token signing key (ECDSA P-256, ES256).
    let sa = KeyPair::generate()?;

    Ok(Pki {
        ca_cert: ca_cert.pem(),
        ca_der: ca_cert.der().to_vec(),
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        admin_cert,
        admin_key,
        kcm_cert,
        kcm_key,
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

/// Standard base64 (for the kubeconfig's `*-data` fields).
pub(crate) fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn generates_pem() {
        let pki = generate().unwrap();
        assert!(pki.ca_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.admin_key.contains("PRIVATE KEY"));
        assert!(pki.sa_pub.contains("PUBLIC KEY"));
    }
}
