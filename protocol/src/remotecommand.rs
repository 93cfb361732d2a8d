//! The Kubernetes remote-command channel protocols (`v4.channel.k8s.io`, `v5.channel.k8s.io`)
//! that `pods/exec` speaks over WebSocket: every binary message starts with its channel byte,
//! and the final `Status` on the error channel carries the exit code. Shared by the embedded API
//! server's simulated node (the server side, as the kubelet) and the resource proxy's terminal
//! (the server side towards kubectl or Argo CD's UI).

use serde::Deserialize;

/// Channel of the process's stdin (client to server).
pub const STDIN: u8 = 0;
/// Channel of the process's stdout (server to client; the terminal's output with a tty).
pub const STDOUT: u8 = 1;
/// Channel of the process's stderr (server to client).
pub const STDERR: u8 = 2;
/// Channel of the final `Status` (server to client).
pub const ERROR: u8 = 3;
/// Channel of terminal resizes (client to server, JSON `{"Width":w,"Height":h}`).
pub const RESIZE: u8 = 4;
/// v5 only: `[255, ch]` closes channel `ch`.
pub const CLOSE: u8 = 255;

/// `v5.channel.k8s.io`: v4 plus the close-channel frame.
pub const V5: &str = "v5.channel.k8s.io";
/// `v4.channel.k8s.io`: binary frames, a JSON `Status` on the error channel.
pub const V4: &str = "v4.channel.k8s.io";

/// The subprotocols served, preferred first.
pub const PROTOCOLS: &[&str] = &[V5, V4];

/// Pick the subprotocol from the client's `Sec-WebSocket-Protocol` header values (comma lists).
#[must_use]
pub fn negotiate<'a>(offered: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let offered: Vec<String> =
        offered.into_iter().flat_map(|v| v.split(',')).map(|p| p.trim().to_ascii_lowercase()).collect();
    PROTOCOLS.iter().copied().find(|p| offered.iter().any(|o| o == p))
}

/// Whether a request asks for a WebSocket upgrade (`Connection: upgrade`, `Upgrade: websocket`,
/// each a comma list matched without regard to case).
#[must_use]
pub fn is_websocket_upgrade(headers: &http::HeaderMap) -> bool {
    let has = |name: http::header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    has(http::header::CONNECTION, "upgrade") && has(http::header::UPGRADE, "websocket")
}

/// A terminal size, as the resize channel carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TermSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

/// What one client frame asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// Bytes for the process's stdin (may be empty: a channel-open frame).
    Stdin(&'a [u8]),
    /// A new terminal size.
    Resize(TermSize),
    /// v5: the client closed a channel (stdin: end of input).
    Close(u8),
}

/// Why a client frame is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// No channel byte.
    #[error("empty frame")]
    Empty,
    /// A channel the client may not write to.
    #[error("the client cannot write to channel {0}")]
    Channel(u8),
    /// A resize that is not `{"Width":w,"Height":h}` with 16-bit sizes.
    #[error("bad resize message: {0}")]
    Resize(String),
    /// A close frame without exactly one channel, or in v4.
    #[error("bad close frame")]
    Close,
}

/// Parse one binary frame from the client. `v5` enables the close frame.
///
/// # Errors
/// The frame is empty, names a channel the client does not write, or is malformed.
pub fn parse_client_frame(data: &[u8], v5: bool) -> Result<ClientFrame<'_>, FrameError> {
    let (&ch, rest) = data.split_first().ok_or(FrameError::Empty)?;
    match ch {
        STDIN => Ok(ClientFrame::Stdin(rest)),
        RESIZE => {
            let size: TermSize = serde_json::from_slice(rest).map_err(|e| FrameError::Resize(e.to_string()))?;
            Ok(ClientFrame::Resize(size))
        }
        CLOSE if v5 => match rest {
            [c] => Ok(ClientFrame::Close(*c)),
            _ => Err(FrameError::Close),
        },
        other => Err(FrameError::Channel(other)),
    }
}

/// A server frame: the channel byte, then the data.
#[must_use]
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    v
}

/// The final status of an exec, as the kubelet writes it on the error channel: kubectl and
/// kube-rs turn `NonZeroExitCode` into the command's exit code.
#[must_use]
pub fn exit_status(code: i32, command: &[String]) -> serde_json::Value {
    if code == 0 {
        return success_status();
    }
    exit_code_status(
        i64::from(code),
        &format!("command terminated with non-zero exit code: command '{}' exited with {code}", command.join(" ")),
    )
}

/// The kubelet's `Status` of a command that exited 0.
#[must_use]
pub fn success_status() -> serde_json::Value {
    serde_json::json!({"metadata": {}, "status": "Success"})
}

/// The kubelet's `Status` of a command that exited `code` (not 0), saying `message`.
#[must_use]
pub fn exit_code_status(code: i64, message: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// A failure that is not an exit code (the command could not start), on the error channel.
#[must_use]
pub fn failure_status(message: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        assert_eq!(parse_client_frame(b"\x00abc", true), Ok(ClientFrame::Stdin(b"abc")));
        assert_eq!(parse_client_frame(b"\x00", false), Ok(ClientFrame::Stdin(b"")));
        let mut resize = vec![RESIZE];
        resize.extend_from_slice(br#"{"Width":120,"Height":40}"#);
        assert_eq!(parse_client_frame(&resize, true), Ok(ClientFrame::Resize(TermSize { width: 120, height: 40 })));
        assert!(matches!(parse_client_frame(b"\x04{\"Width\":70000,\"Height\":1}", true), Err(FrameError::Resize(_))));
        assert!(matches!(parse_client_frame(b"\x04nope", true), Err(FrameError::Resize(_))));
        assert_eq!(parse_client_frame(&[255, 0], true), Ok(ClientFrame::Close(0)));
        assert_eq!(parse_client_frame(&[255, 0], false), Err(FrameError::Channel(255)));
        assert_eq!(parse_client_frame(&[255], true), Err(FrameError::Close));
        assert_eq!(parse_client_frame(&[255, 0, 1], true), Err(FrameError::Close));
        assert_eq!(parse_client_frame(&[1, 2], true), Err(FrameError::Channel(1)));
        assert_eq!(parse_client_frame(&[], true), Err(FrameError::Empty));
        assert_eq!(frame(STDOUT, b"hi"), b"\x01hi".to_vec());
    }

    #[test]
    fn negotiation_prefers_v5() {
        assert_eq!(negotiate(["v4.channel.k8s.io, v5.channel.k8s.io"]), Some(V5));
        assert_eq!(negotiate(["v4.channel.k8s.io", "channel.k8s.io"]), Some(V4));
        assert_eq!(negotiate(["base64.channel.k8s.io"]), None);
        assert_eq!(negotiate([]), None);
    }

    #[test]
    fn statuses_match_the_kubelet() {
        assert_eq!(exit_status(0, &[]).to_string(), r#"{"metadata":{},"status":"Success"}"#);
        let s = exit_status(3, &["sh".into(), "-c".into(), "exit 3".into()]);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert!(s["message"].as_str().unwrap_or_default().starts_with("command terminated with non-zero exit code: "));
    }
}
