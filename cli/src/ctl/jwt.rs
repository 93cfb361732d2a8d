//! `argocd-agentctl jwt`: the principal's JWT signing key, an RSA-4096 PKCS#8 PEM in field
//! `jwt.key` of the `Opaque` secret `argocd-agent-jwt` in the principal's namespace (upstream
//! `cmd/ctl/jwt.go`; the principal signs RS512 with it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Subcommand;

use super::GlobalFlags;
use super::kube::{IfExists, Written, field_text};
use super::out::{OutFile, write_files};

/// Secret holding the JWT signing key.
pub const SECRET_JWT: &str = "argocd-agent-jwt";
/// Field of the key in that secret.
pub const FIELD_JWT_KEY: &str = "jwt.key";
/// Upstream's key size.
const JWT_RSA_BITS: u32 = 4096;

/// `jwt` subcommands (named as upstream's, hence the shared postfix).
#[derive(Debug, Subcommand)]
#[allow(clippy::enum_variant_names)]
pub enum JwtCommand {
    /// Create a JWT signing key and store it in a Kubernetes secret (RSA-4096, PKCS#8 PEM).
    CreateKey(CreateKeyArgs),
    /// Inspect the JWT signing key.
    InspectKey(InspectKeyArgs),
    /// Delete the JWT signing key secret.
    DeleteKey(DeleteKeyArgs),
}

/// `jwt create-key` flags.
#[derive(Debug, clap::Args)]
pub struct CreateKeyArgs {
    /// Upsert the JWT key if it exists.
    #[arg(short, long)]
    upsert: bool,
    /// Also write jwt.key into this directory.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Key type: `rsa` (RSA-4096, tokens RS512, upstream's) or `ecdsa-p256` (tokens ES256: a
    /// signature costs a fraction of an RSA-4096 one, for hubs signing in tens of thousands of
    /// agents; an upstream principal cannot read it, so not for a cross-hub pair with upstream).
    #[arg(long = "type", value_name = "TYPE", default_value = "rsa", value_parser = ["rsa", "ecdsa-p256"])]
    key_type: String,
}

/// `jwt inspect-key` flags.
#[derive(Debug, clap::Args)]
pub struct InspectKeyArgs {
    /// Output format (json or text).
    #[arg(short, long, default_value = "json", value_parser = ["json", "text"])]
    output: String,
}

/// `jwt delete-key` flags.
#[derive(Debug, clap::Args)]
pub struct DeleteKeyArgs {
    /// Force deletion without confirmation.
    #[arg(short, long)]
    force: bool,
}

/// Run a `jwt` subcommand.
///
/// # Errors
/// Whatever the subcommand reports.
pub async fn run(global: &GlobalFlags, cmd: JwtCommand) -> anyhow::Result<()> {
    match cmd {
        JwtCommand::CreateKey(args) => create_key(global, args).await,
        JwtCommand::InspectKey(args) => inspect_key(global, &args).await,
        JwtCommand::DeleteKey(args) => delete_key(global, args).await,
    }
}

async fn create_key(global: &GlobalFlags, args: CreateKeyArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let ns = secrets.namespace().to_owned();
    if !args.upsert && secrets.get(SECRET_JWT).await?.is_some() {
        bail!("JWT secret {ns}/{SECRET_JWT} already exists; pass --upsert to replace it");
    }
    println!("Generating JWT signing key...");
    let key_pem = match args.key_type.as_str() {
        "ecdsa-p256" => super::keys::KeyAlgorithm::EcdsaP256.generate()?.serialize_pem(),
        _ => super::keys::generate_rsa_pkcs8_pem(JWT_RSA_BITS)?,
    };
    // What the principal loads: refuse to store a key it would not.
    auth::SigningKey::from_pem(&key_pem).context("the generated JWT key does not load")?;
    let data = BTreeMap::from([(FIELD_JWT_KEY.to_owned(), key_pem.as_bytes().to_vec())]);
    let if_exists = if args.upsert { IfExists::Replace } else { IfExists::Refuse("pass --upsert to replace it") };
    match secrets.write(SECRET_JWT, super::pki::TYPE_OPAQUE, data, if_exists).await? {
        Written::Created => println!("Success. JWT signing key created and stored in secret {ns}/{SECRET_JWT}"),
        Written::Replaced => println!("Success. JWT signing key updated in secret {ns}/{SECRET_JWT}"),
    }
    if let Some(dir) = &args.out_dir {
        write_files(dir, &[OutFile { name: "jwt.key".into(), contents: &key_pem, private: true }])?;
    }
    Ok(())
}

async fn inspect_key(global: &GlobalFlags, args: &InspectKeyArgs) -> anyhow::Result<()> {
    use rsa::pkcs8::{DecodePrivateKey as _, EncodePublicKey as _};
    use rsa::traits::PublicKeyParts as _;
    use sha2::Digest as _;

    let secrets = global.principal_secrets().await?;
    let ns = secrets.namespace().to_owned();
    let secret = secrets
        .get(SECRET_JWT)
        .await?
        .with_context(|| format!("there is no JWT secret {ns}/{SECRET_JWT} (run argocd-agentctl jwt create-key)"))?;
    let pem = field_text(&secret, FIELD_JWT_KEY)?;
    let not_a_key =
        || format!("field {FIELD_JWT_KEY} of secret {ns}/{SECRET_JWT} is not an RSA or ECDSA P-256 PKCS#8 PEM key");
    // The fingerprint is the SHA-256 of the public key's SubjectPublicKeyInfo, as upstream's.
    let (key_type, bits, public_der) = match rsa::RsaPrivateKey::from_pkcs8_pem(&pem) {
        Ok(key) => {
            let der = key.to_public_key().to_public_key_der().context("cannot encode the public key")?;
            ("RSA", key.size() * 8, der.as_bytes().to_vec())
        }
        Err(_) => {
            let key = auth::SigningKey::from_pem(&pem).with_context(not_a_key)?;
            let pair = rcgen::KeyPair::from_pem(&pem).with_context(not_a_key)?;
            ("ECDSA-P256", key.bits(), rcgen::PublicKeyData::subject_public_key_info(&pair))
        }
    };
    let fingerprint = hex::encode(sha2::Sha256::digest(&public_der));
    let created = secret.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
    if args.output == "text" {
        println!(
            "Key type:        {key_type}\nKey length:      {bits}\nCreated:         {created}\nKey fingerprint: {fingerprint}"
        );
    } else {
        println!(
            "{{\"keyType\":\"{key_type}\",\"keyLength\":{bits},\"created\":\"{created}\",\"sha256\":\"{fingerprint}\"}}"
        );
    }
    Ok(())
}

async fn delete_key(global: &GlobalFlags, args: DeleteKeyArgs) -> anyhow::Result<()> {
    let secrets = global.principal_secrets().await?;
    let ns = secrets.namespace().to_owned();
    if !args.force {
        let answer = super::ask("Are you sure you want to delete the JWT signing key? [y/N]:")?;
        if answer != "y" && answer != "Y" {
            println!("Aborted.");
            return Ok(());
        }
    }
    if secrets.delete(SECRET_JWT).await? {
        println!("JWT signing key secret {ns}/{SECRET_JWT} deleted successfully.");
    } else {
        println!("JWT secret {ns}/{SECRET_JWT} does not exist.");
    }
    Ok(())
}
