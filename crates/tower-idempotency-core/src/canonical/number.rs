//! Numbers: parsing a literal, keeping a verbatim spelling where it is already canonical,
//! and deciding whether an integer is exactly a double (I-JSON forbids the rest).

use super::error::{CanonicalizeError, excerpt};
use super::node::Node;
use super::parse::{Failure, Parser};
use super::write::f64_spelling;

impl<'a> Parser<'a> {
    pub(super) fn parse_number(&mut self) -> Result<Node<'a>, Failure> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.syntax("leading zeros are not allowed"));
                }
            }
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
            }
            _ => return Err(self.syntax("expected a digit")),
        }
        let int_end = self.pos;
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            self.digits("expected a digit after '.'")?;
        }
        let frac_end = self.pos;
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.digits("expected a digit in the exponent")?;
        }
        if frac_end == self.pos {
            if let Some(spelling) = self.verbatim_spelling(start, int_start, int_end, frac_end) {
                self.canonical_len += spelling.len();
                return Ok(Node::Verbatim { spelling, integer });
            }
        }
        let int_digits = &self.bytes[int_start..int_end];
        let literal = self.slice(start, self.pos)?;
        let value: f64 = literal.parse().map_err(|_| {
            Box::new(CanonicalizeError::Syntax {
                offset: start,
                reason: "invalid number",
            })
        })?;
        if !value.is_finite() {
            return Err(Box::new(CanonicalizeError::OutOfRange { offset: start }));
        }
        if value == 0.0 {
            // Only the mantissa counts: `0e5` is zero, `1e-400` is not.
            let mantissa_end = literal
                .bytes()
                .position(|b| b == b'e' || b == b'E')
                .map_or(self.pos, |p| start + p);
            if self.bytes[int_start..mantissa_end]
                .iter()
                .any(|b| matches!(b, b'1'..=b'9'))
            {
                return Err(Box::new(CanonicalizeError::OutOfRange { offset: start }));
            }
        } else if integer && !integer_is_exact(int_digits) {
            return Err(Box::new(CanonicalizeError::ImpreciseInteger {
                literal: excerpt(literal),
                offset: start,
            }));
        }
        // Spelled once here for its length and again when written: such numbers (exponents,
        // more than 15 digits) are rare in commands, and keeping the spelling would make
        // every node larger.
        self.canonical_len += f64_spelling(value, &mut ryu_js::Buffer::new()).len();
        Ok(Node::Number { value, integer })
    }

    /// The canonical spelling of a number literal without exponent, when it can be had
    /// without a round trip through `f64`: for a zero, `0`; for a literal with at most
    /// [`SHORT_DIGITS`] significant digits and a magnitude in [1e-6, 1e21), the literal
    /// without trailing fraction zeros (and without the `.` if nothing follows it). That is
    /// ECMAScript's spelling of the nearest double: its digits are the shortest that round
    /// to it, and in that range `Number::toString` writes plain decimal notation.
    pub(super) fn verbatim_spelling(
        &self,
        start: usize,
        int_start: usize,
        int_end: usize,
        frac_end: usize,
    ) -> Option<&'a str> {
        let int = self.bytes.get(int_start..int_end)?;
        if int.len() > SHORT_DIGITS {
            return None;
        }
        let frac = self.bytes.get(int_end + 1..frac_end).unwrap_or_default();
        let kept_frac = frac.iter().rposition(|&b| b != b'0').map_or(0, |p| p + 1);
        let significant = if int == b"0" {
            let Some(leading_zeros) = frac.iter().position(|&b| b != b'0') else {
                return self.text.get(int_start..int_end); // zero, either sign: "0"
            };
            if leading_zeros > 5 {
                return None; // below 1e-6: exponent notation
            }
            kept_frac - leading_zeros
        } else {
            int.len() + kept_frac
        };
        if significant > SHORT_DIGITS {
            return None;
        }
        let end = if kept_frac == 0 {
            int_end
        } else {
            int_end + 1 + kept_frac
        };
        self.text.get(start..end)
    }

    pub(super) fn digits(&mut self, reason: &'static str) -> Result<(), Failure> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.syntax(reason));
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        Ok(())
    }
}

/// A decimal with at most this many significant digits is the shortest spelling of the
/// double nearest to it: every 15-digit decimal survives the trip to a double and back
/// (`f64::DIGITS`), so no shorter decimal can round to the same double.
pub(super) const SHORT_DIGITS: usize = f64::DIGITS as usize;

/// Whether the decimal integer `digits` (ASCII digits, no sign, no leading zeros) is exactly
/// some double: `odd · 2^k` with `odd < 2^53` and the whole below 2^1024.
pub(super) fn integer_is_exact(digits: &[u8]) -> bool {
    if digits.len() <= 38 {
        // 38 decimal digits always fit a u128.
        let n = digits
            .iter()
            .fold(0u128, |n, d| n * 10 + u128::from(d - b'0'));
        if n == 0 {
            return true;
        }
        let bits = 128 - n.leading_zeros();
        return bits - n.trailing_zeros() <= 53;
    }
    integer_is_exact_big(digits)
}

/// 10^309 is the smallest power of ten above f64::MAX; a longer plain integer is never a
/// double, and bounding the length keeps the conversion below linear-times-constant.
pub(super) const MAX_EXACT_DIGITS: usize = 309;
/// Base-2^32 limbs enough for 10^309 (< 2^1027).
pub(super) const LIMBS: usize = 34;

pub(super) fn integer_is_exact_big(digits: &[u8]) -> bool {
    if digits.len() > MAX_EXACT_DIGITS {
        return false;
    }
    let mut limbs = [0u32; LIMBS]; // little-endian
    let mut used = 0usize;
    for chunk in digits.chunks(9) {
        let mut multiplier = 1u64;
        let mut carry = 0u64;
        for d in chunk {
            multiplier *= 10;
            carry = carry * 10 + u64::from(d - b'0');
        }
        for limb in &mut limbs[..used] {
            let t = u64::from(*limb) * multiplier + carry;
            *limb = t as u32; // low half; the high half carries on
            carry = t >> 32;
        }
        if carry != 0 {
            let Some(slot) = limbs.get_mut(used) else {
                return false;
            };
            *slot = carry as u32;
            used += 1;
        }
    }
    let Some(lowest) = limbs[..used].iter().position(|&l| l != 0) else {
        return true; // zero
    };
    let trailing = lowest as u32 * 32 + limbs[lowest].trailing_zeros();
    let top = used - 1; // limbs[top] != 0: a carry only lands when non-zero
    let bits = top as u32 * 32 + (32 - limbs[top].leading_zeros());
    bits <= 1024 && bits - trailing <= 53
}
