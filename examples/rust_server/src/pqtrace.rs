//! A reader of `.pqtrace` attention traces (docs/trace-format.md): an ASCII
//! header of `key value` lines up to `end`, then little-endian arrays, each
//! starting at a multiple of 64 bytes: token ids (int32[N]), then per stored
//! layer Q (dtype[N - q_first][q_heads][head_dim]), K and V
//! (dtype[N][kv_heads][head_dim]).

use std::ops::Range;
use std::path::Path;

/// Element type of a trace's Q, K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceDType {
    F16,
    F32,
}

impl TraceDType {
    pub fn size(self) -> usize {
        match self {
            TraceDType::F16 => 2,
            TraceDType::F32 => 4,
        }
    }
}

/// One array of a trace, decoded from little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Rows {
    /// binary16 bits
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Rows {
    fn decode(bytes: &[u8], dtype: TraceDType) -> Rows {
        match dtype {
            TraceDType::F16 => Rows::F16(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            TraceDType::F32 => Rows::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
        }
    }

    /// Every element as f32.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Rows::F16(bits) => bits.iter().map(|&b| f16_to_f32(b)).collect(),
            Rows::F32(values) => values.clone(),
        }
    }

    /// Whether elements `a` of `self` and `b` of `other` hold the same bits.
    pub fn same_bits(&self, a: Range<usize>, other: &Rows, b: Range<usize>) -> bool {
        match (self, other) {
            (Rows::F16(x), Rows::F16(y)) => x[a] == y[b],
            (Rows::F32(x), Rows::F32(y)) => x[a]
                .iter()
                .map(|v| v.to_bits())
                .eq(y[b].iter().map(|v| v.to_bits())),
            _ => false,
        }
    }
}

/// IEEE binary16 bits to f32 (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x3ff);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        31 if mantissa == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15),
    }
}

/// A whole trace in memory (the committed ones are a few megabytes).
pub struct Trace {
    pub model: String,
    pub text: String,
    pub dtype: TraceDType,
    /// N: tokens with K and V (positions 0..N-1).
    pub tokens: usize,
    /// F: queries are stored for positions F..N-1.
    pub q_first: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The model's layer index of each stored layer, in payload order.
    pub layers: Vec<usize>,
    /// The model's depth (default: the largest stored index + 1).
    pub model_layers: usize,
    data: Vec<u8>,
    token_offset: usize,
    /// Per stored layer: the byte offsets of Q, K and V.
    offsets: Vec<[usize; 3]>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("model", &self.model)
            .field("dtype", &self.dtype)
            .field("tokens", &self.tokens)
            .field("q_first", &self.q_first)
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

fn align64(x: usize) -> usize {
    (x + 63) & !63
}

impl Trace {
    pub fn open(path: &Path) -> Result<Trace, String> {
        let data =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Trace::parse(data).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(data: Vec<u8>) -> Result<Trace, String> {
        let mut model = String::new();
        let mut text = String::new();
        let (mut dtype, mut tokens, mut q_first, mut q_heads, mut kv_heads, mut head_dim) =
            (None, 0, 0, 0, 0, 0);
        let (mut layers, mut model_layers, mut data_offset) = (Vec::new(), None, 0);
        let (mut saw_magic, mut saw_end) = (false, false);

        let number = |key: &str, value: &str| -> Result<usize, String> {
            value
                .parse::<usize>()
                .map_err(|_| format!("header {key}: {value:?} is not a non-negative integer"))
        };
        let mut at = 0;
        while at < data.len() {
            let end = data[at..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(data.len(), |i| at + i);
            let line = std::str::from_utf8(&data[at..end])
                .map_err(|_| "the header is not text".to_owned())?;
            at = end + 1;
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            let value = value.trim();
            match key {
                "PQTRACE" => saw_magic = value == "1",
                "model" => model = value.to_owned(),
                "text" => text = value.to_owned(),
                "dtype" => {
                    dtype = match value {
                        "f16" => Some(TraceDType::F16),
                        "f32" => Some(TraceDType::F32),
                        other => {
                            return Err(format!("header dtype {other:?}: expected f16 or f32"))
                        }
                    }
                }
                "tokens" => tokens = number(key, value)?,
                "q_first" => q_first = number(key, value)?,
                "q_heads" => q_heads = number(key, value)?,
                "kv_heads" => kv_heads = number(key, value)?,
                "head_dim" => head_dim = number(key, value)?,
                "model_layers" => model_layers = Some(number(key, value)?),
                "data_offset" => data_offset = number(key, value)?,
                "layers" => {
                    layers = value
                        .split_whitespace()
                        .map(|l| number(key, l))
                        .collect::<Result<_, _>>()?
                }
                "end" => {
                    saw_end = true;
                    break;
                }
                _ => {} // unknown keys are allowed (format compatibility)
            }
        }

        let dtype = dtype.ok_or("the header has no dtype")?;
        if !saw_magic {
            return Err("not a PQTRACE 1 file (first line)".to_owned());
        }
        if !saw_end {
            return Err("the header has no end line".to_owned());
        }
        if tokens == 0 || q_heads == 0 || kv_heads == 0 || head_dim == 0 || layers.is_empty() {
            return Err(
                "the header lacks tokens, q_heads, kv_heads, head_dim or layers".to_owned(),
            );
        }
        if q_first > tokens || q_heads % kv_heads != 0 {
            return Err(format!("inconsistent header: q_first {q_first}, tokens {tokens}, q_heads {q_heads}, kv_heads {kv_heads}"));
        }
        if data_offset == 0 || data_offset % 64 != 0 || data_offset < at {
            return Err(format!(
                "data_offset {data_offset} is not a multiple of 64 after the header"
            ));
        }

        let q_bytes = (tokens - q_first) * q_heads * head_dim * dtype.size();
        let kv_bytes = tokens * kv_heads * head_dim * dtype.size();
        let token_offset = data_offset;
        let mut next = align64(token_offset + tokens * 4);
        let mut offsets = Vec::with_capacity(layers.len());
        for _ in &layers {
            let q = next;
            let k = align64(q + q_bytes);
            let v = align64(k + kv_bytes);
            next = align64(v + kv_bytes);
            offsets.push([q, k, v]);
        }
        let needed = offsets.last().map_or(0, |o| o[2] + kv_bytes);
        if needed > data.len() {
            return Err(format!(
                "truncated: {} bytes, the payload needs {needed}",
                data.len()
            ));
        }
        let model_layers = model_layers.unwrap_or_else(|| layers.iter().max().map_or(0, |l| l + 1));
        if layers.iter().any(|&l| l >= model_layers) {
            return Err(format!(
                "layers {layers:?} exceed model_layers {model_layers}"
            ));
        }
        Ok(Trace {
            model,
            text,
            dtype,
            tokens,
            q_first,
            q_heads,
            kv_heads,
            head_dim,
            layers,
            model_layers,
            data,
            token_offset,
            offsets,
        })
    }

    pub fn token_ids(&self) -> Vec<i32> {
        let bytes = &self.data[self.token_offset..self.token_offset + self.tokens * 4];
        bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Stored layer `i`'s queries: row r is position q_first + r.
    pub fn queries(&self, i: usize) -> Rows {
        let len = (self.tokens - self.q_first) * self.q_heads * self.head_dim * self.dtype.size();
        Rows::decode(&self.data[self.offsets[i][0]..][..len], self.dtype)
    }

    /// Stored layer `i`'s keys, [tokens][kv_heads][head_dim].
    pub fn keys(&self, i: usize) -> Rows {
        Rows::decode(
            &self.data[self.offsets[i][1]..][..self.kv_len()],
            self.dtype,
        )
    }

    /// Stored layer `i`'s values, [tokens][kv_heads][head_dim].
    pub fn values(&self, i: usize) -> Rows {
        Rows::decode(
            &self.data[self.offsets[i][2]..][..self.kv_len()],
            self.dtype,
        )
    }

    fn kv_len(&self) -> usize {
        self.tokens * self.kv_heads * self.head_dim * self.dtype.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small f32 trace with recognisable values: element i of array a is a*1000+i.
    fn write_trace(truncate: usize) -> Vec<u8> {
        let (tokens, q_first, q_heads, kv_heads, head_dim) =
            (5usize, 3usize, 2usize, 1usize, 4usize);
        let header = format!(
            "PQTRACE 1\nmodel tiny\ntext t.txt\ndtype f32\ntokens {tokens}\nq_first {q_first}\nq_heads {q_heads}\n\
             kv_heads {kv_heads}\nhead_dim {head_dim}\nlayers 1 4\nfuture_key ignored\ndata_offset 0000000256\nend\n"
        );
        let mut data = header.into_bytes();
        assert!(data.len() <= 256, "the header fits before data_offset");
        data.resize(256, b' ');
        // Each array starts at a multiple of 64; the file ends with the last one.
        let push = |data: &mut Vec<u8>, values: Vec<u8>| {
            data.resize(align64(data.len()), 0);
            data.extend(values);
        };
        push(
            &mut data,
            (0..tokens as i32)
                .flat_map(|t| (t + 100).to_le_bytes())
                .collect(),
        );
        for array in 1..=6 {
            let n = if array % 3 == 1 {
                (tokens - q_first) * q_heads * head_dim
            } else {
                tokens * kv_heads * head_dim
            };
            push(
                &mut data,
                (0..n)
                    .flat_map(|i| (array as f32 * 1000.0 + i as f32).to_le_bytes())
                    .collect(),
            );
        }
        data.truncate(data.len() - truncate);
        data
    }

    #[test]
    fn reads_every_array_of_a_written_trace() {
        let trace = Trace::parse(write_trace(0)).unwrap();
        assert_eq!(
            (
                trace.model.as_str(),
                trace.dtype,
                trace.tokens,
                trace.q_first
            ),
            ("tiny", TraceDType::F32, 5, 3)
        );
        assert_eq!((trace.layers.clone(), trace.model_layers), (vec![1, 4], 5));
        assert_eq!(trace.token_ids(), vec![100, 101, 102, 103, 104]);
        assert_eq!(trace.queries(0).to_f32()[0], 1000.0);
        assert_eq!(trace.keys(0).to_f32()[19], 2019.0);
        assert_eq!(trace.values(1).to_f32()[7], 6007.0);
        assert_eq!(trace.queries(1).to_f32()[15], 4015.0);
    }

    #[test]
    fn rejects_truncated_and_foreign_files() {
        assert!(Trace::parse(write_trace(1))
            .unwrap_err()
            .contains("truncated"));
        let mut foreign = write_trace(0);
        foreign[..9].copy_from_slice(b"PQTRACE 2");
        assert!(Trace::parse(foreign).unwrap_err().contains("PQTRACE 1"));
        assert!(Trace::parse(b"hello\n".to_vec()).is_err());
    }

    #[test]
    fn converts_f16_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7e00).is_nan());
    }
}
