//! A minimal blocking RESP2 client over one TCP connection: enough for the harness to
//! ping, read `CLUSTER INFO` / `CLUSTER NODES`, move slots and read keys. No pipelining,
//! no redirection: every command goes to the node it names.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long connecting, one write or one read may take.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A reply of a Redis server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// `+OK` and other simple strings.
    Status(String),
    /// `-ERR …`, `-MOVED …`: the server refused the command.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n …`: a bulk string (`None` for the null bulk string).
    Bulk(Option<Vec<u8>>),
    /// `*n …`: an array (`None` for the null array).
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text: a status, a bulk string (lossy UTF-8) or an integer; `None` for
    /// errors, nulls and arrays.
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Reply::Integer(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// The elements of an array reply (empty for anything else).
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }
}

/// Sends one command to the server on `127.0.0.1:port` over a fresh connection and reads
/// its reply. `Err` when the server cannot be reached or does not answer within a few
/// seconds; a refused command is `Ok(Reply::Error(..))`.
pub fn command<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Result<Reply, String> {
    let mut replies = commands(port, &[args])?;
    replies
        .pop()
        .ok_or_else(|| format!("Redis on port {port}: no reply"))
}

/// Sends commands one after the other over one fresh connection (for what is per
/// connection: `ASKING`, `READONLY`, `MULTI`) and reads their replies, in order.
pub fn commands<A: AsRef<[u8]>>(port: u16, each: &[&[A]]) -> Result<Vec<Reply>, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .map_err(|err| format!("cannot connect to Redis on port {port}: {err}"))?;
    let io = |err: std::io::Error| format!("Redis on port {port}: {err}");
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    let mut reader = BufReader::new(&stream);
    let mut replies = Vec::with_capacity(each.len());
    for args in each {
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in *args {
            let arg = arg.as_ref();
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
        (&stream).write_all(&request).map_err(io)?;
        replies.push(read_reply(&mut reader).map_err(io)?);
    }
    Ok(replies)
}

/// [`command`], with an error reply turned into `Err` as well.
pub fn command_ok<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Result<Reply, String> {
    match command(port, args)? {
        Reply::Error(err) => {
            let name: Vec<String> = args
                .iter()
                .take(3)
                .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
                .collect();
            Err(format!("{} on port {port}: {err}", name.join(" ")))
        }
        reply => Ok(reply),
    }
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        return Err(invalid("truncated reply"));
    }
    let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    let number = || body.parse::<i64>().map_err(|_| invalid("bad length"));
    Ok(match line[0] {
        b'+' => Reply::Status(body),
        b'-' => Reply::Error(body),
        b':' => Reply::Integer(number()?),
        b'$' => match usize::try_from(number()?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut data = vec![0; len + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len);
                Reply::Bulk(Some(data))
            }
        },
        b'*' => match usize::try_from(number()?) {
            Err(_) => Reply::Array(None),
            Ok(len) => {
                let mut items = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(Some(items))
            }
        },
        _ => return Err(invalid("unknown reply type")),
    })
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}
