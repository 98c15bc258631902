//! The compact binary forms of two columns of `idempotency_operations` (migration 0014):
//! the fingerprint and the stored response headers. Both are written and read here; the
//! SQL functions of migration 0014 (`idempotency_fingerprint_text`,
//! `idempotency_fingerprint_bytes`, `idempotency_headers_bytes`) produce and read the same
//! bytes for the statements that need them in SQL.

use tower_idempotency_core::Fingerprint;

/// Tag byte of a fingerprint that is not one of the two digest forms: its UTF-8 text
/// follows as it is.
const TAG_TEXT: u8 = 0;

/// The digest forms: the tag byte, its text prefix.
const DIGEST_FORMS: [(u8, &str); 2] = [(1, "sha256:"), (2, "hmac-sha256:")];

/// The bytes of a SHA-256 digest.
const DIGEST_LEN: usize = 32;

/// A fingerprint as stored: `1` then the 32-byte digest for `sha256:<64 lowercase hex>`,
/// `2` then the digest for `hmac-sha256:<64 lowercase hex>`, else `0` then the text's UTF-8
/// bytes — so that every fingerprint, whatever its form, reads back as the same text.
pub(crate) fn fingerprint_bytes(fingerprint: &str) -> Vec<u8> {
    for (tag, prefix) in DIGEST_FORMS {
        if let Some(digest) = fingerprint
            .strip_prefix(prefix)
            .and_then(lowercase_hex_digest)
        {
            let mut bytes = Vec::with_capacity(1 + DIGEST_LEN);
            bytes.push(tag);
            bytes.extend_from_slice(&digest);
            return bytes;
        }
    }
    let mut bytes = Vec::with_capacity(1 + fingerprint.len());
    bytes.push(TAG_TEXT);
    bytes.extend_from_slice(fingerprint.as_bytes());
    bytes
}

/// The fingerprint that [`fingerprint_bytes`] stored as `bytes`; `None` for bytes it never
/// writes (an unknown tag, a digest of another length, text that is not UTF-8).
pub(crate) fn fingerprint_from_bytes(bytes: &[u8]) -> Option<Fingerprint> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let (&tag, rest) = bytes.split_first()?;
    if tag == TAG_TEXT {
        return std::str::from_utf8(rest).ok().map(Fingerprint::from_stored);
    }
    let (_, prefix) = DIGEST_FORMS.iter().find(|(t, _)| *t == tag)?;
    if rest.len() != DIGEST_LEN {
        return None;
    }
    let mut text = String::with_capacity(prefix.len() + 2 * DIGEST_LEN);
    text.push_str(prefix);
    for byte in rest {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    Some(Fingerprint::from_stored(text))
}

/// The 32 bytes written as exactly 64 lowercase hex digits in `hex`.
fn lowercase_hex_digest(hex: &str) -> Option<[u8; DIGEST_LEN]> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let hex = hex.as_bytes();
    if hex.len() != 2 * DIGEST_LEN {
        return None;
    }
    let mut digest = [0u8; DIGEST_LEN];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        digest[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(digest)
}

/// Stored response headers as one value: for each header in order, the name's length, the
/// name, the value's length, the value — each length an unsigned LEB128 varint (one byte
/// below 128). Values are raw bytes (they need not be UTF-8).
pub(crate) fn headers_bytes<'a>(headers: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (name, value) in headers {
        for part in [name.as_bytes(), value] {
            push_varint(&mut bytes, part.len());
            bytes.extend_from_slice(part);
        }
    }
    bytes
}

/// The `(name, value)` pairs [`headers_bytes`] wrote; `None` when `bytes` is cut short or a
/// name is not UTF-8.
pub(crate) fn headers_from_bytes(mut bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let name = take_part(&mut bytes)?;
        let value = take_part(&mut bytes)?;
        headers.push((String::from_utf8(name.to_vec()).ok()?, value.to_vec()));
    }
    Some(headers)
}

fn push_varint(bytes: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        // The low seven bits, with the continuation bit.
        bytes.push(u8::try_from(n & 0x7f).unwrap_or(0) | 0x80);
        n >>= 7;
    }
    bytes.push(u8::try_from(n).unwrap_or(0));
}

/// One length-prefixed part from the front of `bytes`.
fn take_part<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    let mut len: usize = 0;
    let mut shift = 0u32;
    loop {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        if shift >= usize::BITS {
            return None;
        }
        len |= usize::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    if len > bytes.len() {
        return None;
    }
    let (part, rest) = bytes.split_at(len);
    *bytes = rest;
    Some(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_fingerprints_take_a_tag_byte_and_32_bytes() {
        let sha = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let hmac = format!("hmac-sha256:{}", "fedcba9876543210".repeat(4));
        for (text, tag) in [(&sha, 1), (&hmac, 2)] {
            let bytes = fingerprint_bytes(text);
            assert_eq!((bytes.len(), bytes[0]), (33, tag));
            assert_eq!(fingerprint_from_bytes(&bytes).unwrap().as_str(), text);
        }
    }

    #[test]
    fn any_other_fingerprint_round_trips_as_text() {
        for text in [
            "",
            "sha256:hot",
            "sha256:",
            &format!("sha256:{}", "AB".repeat(32)),
            &format!("sha256:{}0", "ab".repeat(32)),
            &format!("hmac-sha256:{}", "zz".repeat(32)),
            "md5:ü",
        ] {
            let bytes = fingerprint_bytes(text);
            assert_eq!(bytes[0], 0, "{text}");
            assert_eq!(fingerprint_from_bytes(&bytes).unwrap().as_str(), text);
        }
    }

    #[test]
    fn unknown_fingerprint_bytes_are_refused() {
        assert!(fingerprint_from_bytes(&[]).is_none());
        assert!(fingerprint_from_bytes(&[3, 1, 2]).is_none());
        assert!(fingerprint_from_bytes(&[1; 32]).is_none());
        assert!(fingerprint_from_bytes(&[0, 0xff]).is_none());
    }

    #[test]
    fn headers_round_trip_in_order_with_raw_values() {
        let long = vec![b'v'; 300];
        let headers: Vec<(&str, &[u8])> = vec![
            ("content-type", b"application/json"),
            ("x-raw", &[0xff, 0x00, 0x80]),
            ("set-cookie", b"a=1"),
            ("set-cookie", b""),
            ("x-long", &long),
        ];
        let bytes = headers_bytes(headers.iter().copied());
        assert_eq!(&bytes[..14], b"\x0ccontent-type\x10");
        let read = headers_from_bytes(&bytes).unwrap();
        let read: Vec<(&str, &[u8])> = read
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect();
        assert_eq!(read, headers);
        // A 300-byte value's length takes two bytes.
        assert_eq!(
            bytes.len(),
            headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 2)
                .sum::<usize>()
                + 1
        );
        assert_eq!(headers_from_bytes(&[]).unwrap(), vec![]);
    }

    #[test]
    fn cut_header_bytes_are_refused() {
        let bytes = headers_bytes([("a", &b"bc"[..])]);
        for len in 1..bytes.len() {
            assert!(headers_from_bytes(&bytes[..len]).is_none(), "{len}");
        }
        assert!(headers_from_bytes(&[0x80]).is_none());
        assert!(headers_from_bytes(&[0xff; 12]).is_none());
    }
}
