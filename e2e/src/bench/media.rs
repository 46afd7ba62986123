//! Synapse's view of media: the upload limit, how many bytes a user has uploaded (to see
//! whether a second send of the same file uploaded again) and clean-up between runs, so a long
//! benchmark does not fill the disk.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::User;
use crate::matrix::enc;

/// The media side of Synapse's client and admin APIs, as `admin`.
#[derive(Debug)]
pub struct Media<'a> {
    hs_url: &'a str,
    admin: &'a User,
    http: reqwest::Client,
}

impl<'a> Media<'a> {
    /// Talks to `hs_url` with `admin`'s token (a homeserver admin).
    pub fn new(hs_url: &'a str, admin: &'a User) -> Result<Self> {
        Ok(Self {
            hs_url,
            admin,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str) -> Result<Value> {
        let url = format!("{}{path}", self.hs_url);
        let resp = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.admin.token)
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{method} {path}: {status} {v}");
        }
        Ok(v)
    }

    /// The largest upload the homeserver takes (`m.upload.size`), if it says.
    pub async fn upload_limit(&self) -> Result<Option<u64>> {
        let v = self
            .call(reqwest::Method::GET, "/_matrix/client/v1/media/config")
            .await?;
        Ok(v["m.upload.size"].as_u64())
    }

    /// Total bytes of every media `user_id` has uploaded.
    pub async fn uploaded_bytes(&self, user_id: &str) -> Result<u64> {
        let mut total = 0;
        let mut from = 0u64;
        loop {
            let v = self
                .call(
                    reqwest::Method::GET,
                    &format!(
                        "/_synapse/admin/v1/users/{}/media?from={from}&limit=500",
                        enc(user_id)
                    ),
                )
                .await?;
            let media = v["media"].as_array().context("media list")?;
            total += media
                .iter()
                .filter_map(|m| m["media_length"].as_u64())
                .sum::<u64>();
            match v["next_token"].as_u64() {
                Some(next) if !media.is_empty() => from = next,
                _ => return Ok(total),
            }
        }
    }

    /// Deletes every media `user_id` has uploaded (the API deletes a page at a time).
    pub async fn delete_all(&self, user_id: &str) -> Result<()> {
        let path = format!("/_synapse/admin/v1/users/{}/media?limit=500", enc(user_id));
        for _ in 0..100 {
            let v = self.call(reqwest::Method::DELETE, &path).await?;
            if v["total"].as_u64().unwrap_or(0) == 0 {
                return Ok(());
            }
        }
        bail!("{user_id} still has media after 100 deletions")
    }
}
