//! One typed WebSocket connection to the agent: `send(&ToAgent)` and `recv() -> ToSurface`.
//! Nothing else in the surface sees raw frames.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use protocol::{ChatId, MAX_MESSAGE_BYTES, ToAgent, ToSurface};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use url::Url;

use crate::config::Secret;

/// How long connecting (TCP + upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The agent refused the token (HTTP 401/403).
    #[error("agent refused the token (HTTP {0})")]
    Unauthorized(u16),
    /// Connecting took too long.
    #[error("connecting to the agent timed out")]
    Timeout,
    /// Network or WebSocket protocol failure.
    #[error("websocket: {0}")]
    Ws(#[from] tungstenite::Error),
    /// A message could not be encoded.
    #[error("encode: {0}")]
    Encode(#[from] serde_json::Error),
    /// The URL could not be built.
    #[error("bad agent url: {0}")]
    Url(String),
}

impl ConnectionError {
    /// Whether the agent refused the token: only an operator can fix that, so it is logged
    /// as an error, not as a passing outage (the link keeps retrying either way).
    pub fn is_auth(&self) -> bool {
        matches!(self, Self::Unauthorized(_))
    }
}

/// The WebSocket URL of `chat` on the agent at `base`.
pub fn chat_url(base: &Url, chat: &ChatId) -> Result<Url, ConnectionError> {
    let s = format!(
        "{}{}",
        base.as_str().trim_end_matches('/'),
        protocol::agent_ws_path(chat)
    );
    Url::parse(&s).map_err(|e| ConnectionError::Url(e.to_string()))
}

/// A connected, typed WebSocket.
#[derive(Debug)]
pub struct Connection {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// When the last frame of any kind (pings and pongs included) arrived: the agent's
    /// keepalive pings prove it is alive even when no message is due.
    last_frame: Instant,
}

impl Connection {
    /// Connects to the agent's endpoint for `chat` with the bearer `token`.
    pub async fn connect(
        base: &Url,
        chat: &ChatId,
        token: &Secret,
    ) -> Result<Self, ConnectionError> {
        let url = chat_url(base, chat)?;
        let mut request = url.as_str().into_client_request()?;
        let auth = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map_err(|_| ConnectionError::Url("token is not a valid header value".into()))?;
        request.headers_mut().insert(header::AUTHORIZATION, auth);
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let fut = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
        let (ws, _) = match tokio::time::timeout(CONNECT_TIMEOUT, fut).await {
            Err(_) => return Err(ConnectionError::Timeout),
            Ok(Err(tungstenite::Error::Http(resp)))
                if matches!(
                    resp.status(),
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                ) =>
            {
                return Err(ConnectionError::Unauthorized(resp.status().as_u16()));
            }
            Ok(r) => r?,
        };
        Ok(Self {
            ws,
            last_frame: Instant::now(),
        })
    }

    /// When the last frame arrived (or the connection was made).
    pub fn last_frame(&self) -> Instant {
        self.last_frame
    }

    /// Sends one message as a text frame.
    pub async fn send(&mut self, msg: &ToAgent) -> Result<(), ConnectionError> {
        let text = serde_json::to_string(msg)?;
        self.ws.send(Message::text(text)).await?;
        Ok(())
    }

    /// Sends a ping (keepalive).
    pub async fn ping(&mut self) -> Result<(), ConnectionError> {
        self.ws.send(Message::Ping(Default::default())).await?;
        Ok(())
    }

    /// The next message from the agent; `None` when the connection is closed. Frames that do
    /// not decode, and `type`s this version does not know, are logged and skipped.
    pub async fn recv(&mut self) -> Result<Option<ToSurface>, ConnectionError> {
        loop {
            let Some(frame) = self.ws.next().await else {
                return Ok(None);
            };
            let frame = frame?;
            self.last_frame = Instant::now();
            match frame {
                Message::Text(text) => match serde_json::from_str::<ToSurface>(text.as_str()) {
                    Ok(ToSurface::Unknown) => {
                        tracing::warn!(
                            r#type = protocol::peek_type(text.as_str()).as_deref().unwrap_or("?"),
                            "ignoring agent message of unknown type"
                        );
                    }
                    Ok(msg) => return Ok(Some(msg)),
                    Err(e) => {
                        tracing::warn!(
                            r#type = protocol::peek_type(text.as_str()).as_deref().unwrap_or("?"),
                            error = %e,
                            "ignoring agent message that does not decode"
                        );
                    }
                },
                Message::Close(_) => return Ok(None),
                Message::Binary(_) => tracing::warn!("ignoring binary frame from agent"),
                // Pongs are queued by tungstenite itself; pongs to our pings need nothing.
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    }

    /// Closes the connection politely (best effort).
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let chat = ChatId::new("abc-r-0123").unwrap();
        for base in ["ws://127.0.0.1:8700", "ws://127.0.0.1:8700/"] {
            assert_eq!(
                chat_url(&Url::parse(base).unwrap(), &chat)
                    .unwrap()
                    .as_str(),
                "ws://127.0.0.1:8700/v1/agent_ws/abc-r-0123/"
            );
        }
        assert_eq!(
            chat_url(&Url::parse("wss://h/prefix").unwrap(), &chat)
                .unwrap()
                .as_str(),
            "wss://h/prefix/v1/agent_ws/abc-r-0123/"
        );
    }
}
