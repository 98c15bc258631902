//! The MCP suite's session: the mcp-demo serves rmcp's Streamable HTTP transport in session
//! mode for 2025-06-18 clients (`initialize` answers an `Mcp-Session-Id`; every later request
//! carries it), so `load-bench` opens one session per server before wrk runs, over plain
//! HTTP/1.1 on loopback, and hands its id to the wrk script (`mcp_requests.lua`) in the
//! environment variable [`SESSION_ENV`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The environment variable the wrk script reads the session id from.
pub const SESSION_ENV: &str = "MCP_SESSION_ID";

/// The bearer token of the script's calls: the actor `acme`.
const AUTHORIZATION: &str = "Bearer acme";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"load-bench","version":"1"}}}"#;

const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Opens a session on the MCP server at `base` (`http://127.0.0.1:PORT`): `initialize`, then
/// `notifications/initialized`; returns the session id.
pub fn open_session(base: &str) -> Result<String, String> {
    let address = base
        .strip_prefix("http://")
        .filter(|a| a.starts_with("127.0.0.1:"))
        .ok_or_else(|| format!("refusing to open an MCP session on {base}: loopback only"))?;
    let (status, head) = post(address, INITIALIZE, None)?;
    if status != 200 {
        return Err(format!("initialize answered {status}: {head}"));
    }
    let session = header(&head, "mcp-session-id")
        .ok_or_else(|| format!("initialize answered no Mcp-Session-Id: {head}"))?;
    let (status, head) = post(address, INITIALIZED, Some(&session))?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "notifications/initialized answered {status}: {head}"
        ));
    }
    Ok(session)
}

/// One `POST /mcp` of `body` on a new connection; returns the status and the response head
/// (the body, an SSE stream for `initialize`, is not read).
fn post(address: &str, body: &str, session: Option<&str>) -> Result<(u16, String), String> {
    let failed = |e: std::io::Error| format!("MCP handshake with {address}: {e}");
    let mut stream = TcpStream::connect(address).map_err(failed)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(failed)?;
    let session = session
        .map(|id| format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-06-18\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: {AUTHORIZATION}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         {session}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(failed)?;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let end = loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut buffer).map_err(failed)?;
        if n == 0 || received.len() > 64 * 1024 {
            return Err(format!(
                "MCP handshake with {address}: no complete response head: {}",
                String::from_utf8_lossy(&received)
            ));
        }
        received.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("MCP handshake with {address}: no status in {head}"))?;
    Ok((status, head))
}

/// The value of header `name` (lowercase) in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_header_is_found_in_any_case() {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nMcp-Session-Id: abc-1\r\n";
        assert_eq!(header(head, "mcp-session-id").as_deref(), Some("abc-1"));
        assert_eq!(header(head, "x-other"), None);
        assert!(open_session("http://example.com:80").is_err());
    }
}
