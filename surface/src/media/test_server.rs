//! A tiny fake of the homeserver's media endpoints for fast unit tests (the real-Synapse tests
//! live in the e2e crate).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use matrix_sdk::reqwest;

use super::MediaApi;

pub(crate) const TOKEN: &str = "test-token-0123456789";

/// What the fake answers for a media id.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// 200 with `Content-Length`.
    Body(Vec<u8>),
    /// 200, chunked, no `Content-Length`.
    Chunked(Vec<Vec<u8>>),
    /// 429 with `retry_after_ms`.
    RateLimited(u64),
    /// That status with a Matrix error body.
    Status(u16),
}

/// One stored upload.
#[derive(Debug, Clone)]
pub(crate) struct Upload {
    pub content_type: Option<String>,
    pub content_length: Option<String>,
    pub filename: Option<String>,
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct Inner {
    media: Mutex<BTreeMap<String, Reply>>,
    failures: Mutex<BTreeMap<String, VecDeque<Reply>>>,
    hits: Mutex<BTreeMap<String, usize>>,
    uploads: Mutex<Vec<Upload>>,
    upload_failures: Mutex<VecDeque<Reply>>,
}

pub(crate) struct TestServer {
    inner: Arc<Inner>,
    pub base: url::Url,
    pub auth_failures: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct AppState {
    inner: Arc<Inner>,
    auth_failures: Arc<AtomicUsize>,
}

impl TestServer {
    pub(crate) async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let auth_failures = Arc::new(AtomicUsize::new(0));
        let state = AppState {
            inner: Arc::clone(&inner),
            auth_failures: Arc::clone(&auth_failures),
        };
        let app = Router::new()
            .route(
                "/_matrix/client/v1/media/download/{server}/{id}",
                get(download),
            )
            .route("/_matrix/media/v3/upload", post(upload))
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            inner,
            base: url::Url::parse(&format!("http://{addr}")).unwrap(),
            auth_failures,
        }
    }

    pub(crate) fn api(&self) -> MediaApi {
        MediaApi::new(reqwest::Client::new(), self.base.clone(), TOKEN)
    }

    pub(crate) fn put_media(&self, id: &str, reply: Reply) {
        self.inner.media.lock().unwrap().insert(id.into(), reply);
    }

    /// The next requests for `id` get these replies first.
    pub(crate) fn fail_first(&self, id: &str, replies: Vec<Reply>) {
        self.inner
            .failures
            .lock()
            .unwrap()
            .insert(id.into(), replies.into());
    }

    pub(crate) fn fail_uploads_first(&self, replies: Vec<Reply>) {
        *self.inner.upload_failures.lock().unwrap() = replies.into();
    }

    pub(crate) fn hits(&self, id: &str) -> usize {
        self.inner
            .hits
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn uploads(&self) -> Vec<Upload> {
        self.inner.uploads.lock().unwrap().clone()
    }
}

fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let ok = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !ok {
        state.auth_failures.fetch_add(1, Ordering::SeqCst);
    }
    ok
}

fn respond(reply: Reply) -> Response {
    match reply {
        Reply::Body(b) => (StatusCode::OK, b).into_response(),
        Reply::Chunked(chunks) => {
            let stream = futures_util::stream::iter(
                chunks
                    .into_iter()
                    .map(|c| Ok::<_, std::convert::Infallible>(Bytes::from(c))),
            );
            (StatusCode::OK, Body::from_stream(stream)).into_response()
        }
        Reply::RateLimited(ms) => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                r#"{{"errcode":"M_LIMIT_EXCEEDED","error":"slow down","retry_after_ms":{ms}}}"#
            ),
        )
            .into_response(),
        Reply::Status(s) => (
            StatusCode::from_u16(s).unwrap(),
            r#"{"errcode":"M_UNKNOWN","error":"test failure"}"#,
        )
            .into_response(),
    }
}

async fn download(
    State(state): State<AppState>,
    Path((_server, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&state, &headers) {
        return respond(Reply::Status(401));
    }
    *state
        .inner
        .hits
        .lock()
        .unwrap()
        .entry(id.clone())
        .or_default() += 1;
    let queued = state
        .inner
        .failures
        .lock()
        .unwrap()
        .get_mut(&id)
        .and_then(VecDeque::pop_front);
    if let Some(reply) = queued {
        return respond(reply);
    }
    match state.inner.media.lock().unwrap().get(&id).cloned() {
        Some(reply) => respond(reply),
        None => (
            StatusCode::NOT_FOUND,
            r#"{"errcode":"M_NOT_FOUND","error":"Not found"}"#,
        )
            .into_response(),
    }
}

async fn upload(
    State(state): State<AppState>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&state, &headers) {
        return respond(Reply::Status(401));
    }
    let queued = state.inner.upload_failures.lock().unwrap().pop_front();
    if let Some(reply) = queued {
        return respond(reply);
    }
    let header = |h| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut uploads = state.inner.uploads.lock().unwrap();
    uploads.push(Upload {
        content_type: header(header::CONTENT_TYPE),
        content_length: header(header::CONTENT_LENGTH),
        filename: query.get("filename").cloned(),
        bytes: body.to_vec(),
    });
    let id = format!("up{}", uploads.len());
    state
        .inner
        .media
        .lock()
        .unwrap()
        .insert(id.clone(), Reply::Body(body.to_vec()));
    (
        StatusCode::OK,
        format!(r#"{{"content_uri":"mxc://example.org/{id}"}}"#),
    )
        .into_response()
}
