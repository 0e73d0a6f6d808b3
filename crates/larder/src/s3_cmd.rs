//! `larder s3 key create|revoke|list`: the S3 API's access keys, stored in the cluster;
//! `larder s3 presign`: a presigned GET or PUT URL signed with one of them. The
//! command reaches the storage nodes as a frontend does, with a frontend's config (cluster map,
//! datacenter, and the cluster secret or `[pool.tls]` certificate): whoever can run it can
//! already reach the data, and no public endpoint hands out keys.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Args, Subcommand};
use larder_s3::{KeyAdmin, Permission, Presign};

use crate::configs;

#[derive(Subcommand)]
pub enum S3Command {
    /// Access keys for the S3 API.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Print a presigned URL: a GET or PUT of one object (or, for `/v1/blobs` paths, a blob
    /// upload, read or delete) that whoever holds it may do until it expires, signed (SigV4)
    /// with a key's secret read from the cluster; the key's grants apply.
    Presign(PresignArgs),
}

#[derive(Args)]
pub struct PresignArgs {
    #[command(flatten)]
    target: Target,
    /// The access key ID whose secret signs the URL.
    #[arg(long)]
    access_key_id: String,
    /// The request the URL allows.
    #[arg(long, default_value = "GET", value_parser = ["GET", "PUT", "HEAD", "POST", "DELETE"])]
    method: String,
    /// Seconds until the URL expires (at most 604800, seven days), as `aws s3 presign`.
    #[arg(long, default_value_t = 900)]
    expires_in: u64,
    /// The endpoint clients reach, `http(s)://host:port` (default: the config's `[s3]
    /// listen`, or its `listen` for a `/v1/blobs` path; 127.0.0.1 for an unspecified address).
    #[arg(long)]
    endpoint: Option<String>,
    /// The SigV4 region (any; Larder serves one).
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// The object: `s3://BUCKET/KEY` or `BUCKET/KEY`; or a blob API path, `/v1/blobs` (POST,
    /// an upload) or `/v1/blobs/<id>` (GET, HEAD, DELETE), for frontends with `[auth]
    /// require_signed_blob_urls`.
    object: String,
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create a key; prints its ID and secret as JSON (the only time the secret is shown).
    Create(CreateArgs),
    /// Revoke a key (within a second every frontend refuses it).
    Revoke(RevokeArgs),
    /// List the keys and their grants (not their secrets).
    List(Target),
}

#[derive(Args)]
pub struct Target {
    /// A frontend's config (`larder dev` writes `<data-dir>/frontend-dc1.toml`).
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args)]
pub struct CreateArgs {
    #[command(flatten)]
    target: Target,
    /// A grant, BUCKET:PERMISSION (permission read, write or owner; bucket `*` for all);
    /// repeatable. Owner may also create and delete the bucket.
    #[arg(long = "grant", value_parser = parse_grant, required = true)]
    grants: Vec<(String, Permission)>,
}

#[derive(Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    target: Target,
    /// The key's access key ID.
    access_key_id: String,
}

fn parse_grant(text: &str) -> Result<(String, Permission), String> {
    let (bucket, permission) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not BUCKET:PERMISSION"))?;
    if bucket.is_empty() {
        return Err(format!("{text:?} names no bucket (use * for every bucket)"));
    }
    Ok((bucket.to_owned(), permission.parse()?))
}

pub fn run(command: S3Command) -> anyhow::Result<()> {
    let target = match &command {
        S3Command::Key(KeyCommand::Create(args)) => &args.target,
        S3Command::Key(KeyCommand::Revoke(args)) => &args.target,
        S3Command::Key(KeyCommand::List(target)) => target,
        S3Command::Presign(args) => &args.target,
    };
    let (config, map) = configs::frontend(&target.config)?;
    crate::cli::runtime()?.block_on(async move {
        let nodes = map.nodes.iter().map(|n| (n.id.clone(), n.address));
        let credentials = config.auth.credentials().map_err(anyhow::Error::msg)?;
        let pool = larder_pool::StoragePool::new(nodes, config.pool.clone(), credentials)
            .context("connecting to the storage nodes")?;
        let router = larder_router::Router::new(
            Arc::new(map),
            pool,
            config.router.clone(),
            &config.datacenter,
        )
        .map_err(anyhow::Error::msg)?;
        let home = config
            .s3
            .as_ref()
            .and_then(|s3| s3.home_datacenter.as_deref());
        let records_router =
            larder_s3::records_router(&Arc::new(router), home).map_err(anyhow::Error::msg)?;
        let admin = KeyAdmin::new(records_router);
        match command {
            S3Command::Key(command) => keys(&admin, command).await,
            S3Command::Presign(args) => {
                let listen = match args.object.starts_with("/v1/blobs") {
                    true => Some(config.listen),
                    false => config.s3.as_ref().map(|s3| s3.listen),
                };
                println!("{}", presign(&admin, args, listen).await?);
                Ok(())
            }
        }
    })
}

async fn keys(admin: &KeyAdmin, command: KeyCommand) -> anyhow::Result<()> {
    match command {
        KeyCommand::Create(args) => {
            let key = admin.create(args.grants).await?;
            println!("{}", serde_json::to_string_pretty(&key)?);
        }
        KeyCommand::Revoke(args) => {
            anyhow::ensure!(
                admin.revoke(&args.access_key_id).await?,
                "no key {}",
                args.access_key_id
            );
            println!("revoked {}", args.access_key_id);
        }
        KeyCommand::List(_) => {
            for (id, grants) in admin.list().await? {
                let grants: Vec<String> =
                    grants.iter().map(|(b, p)| format!("{b}:{p:?}")).collect();
                println!("{id}  {}", grants.join(" ").to_lowercase());
            }
        }
    }
    Ok(())
}

/// The presigned URL `args` ask for.
async fn presign(
    admin: &KeyAdmin,
    args: PresignArgs,
    listen: Option<SocketAddr>,
) -> anyhow::Result<String> {
    let object = args.object.strip_prefix("s3://").unwrap_or(&args.object);
    // `/v1/blobs/<id>` signs as bucket `v1`, key `blobs/<id>`: the same path.
    let object = object.strip_prefix('/').unwrap_or(object);
    let (bucket, key) = object
        .split_once('/')
        .filter(|(b, k)| !b.is_empty() && !k.is_empty())
        .with_context(|| format!("{:?} is not BUCKET/KEY", args.object))?;
    let endpoint = match (args.endpoint, listen) {
        (Some(endpoint), _) => endpoint.trim_end_matches('/').to_owned(),
        (None, Some(mut listen)) => {
            if listen.ip().is_unspecified() {
                listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            format!("http://{listen}")
        }
        (None, None) => anyhow::bail!("the config has no [s3]; pass --endpoint"),
    };
    let secret = admin
        .secret(&args.access_key_id)
        .await?
        .with_context(|| format!("no key {}", args.access_key_id))?;
    let url = larder_s3::presign(&Presign {
        method: &args.method,
        endpoint: &endpoint,
        bucket,
        key,
        access_key_id: &args.access_key_id,
        secret: &secret,
        region: &args.region,
        expires: Duration::from_secs(args.expires_in),
        now: SystemTime::now(),
    })?;
    Ok(url)
}
