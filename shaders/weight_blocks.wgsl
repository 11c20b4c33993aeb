// The GGML block formats of weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
// MXFP4, IQ4_XS, Q2_K, Q3_K), read
// where a kernel reads weights: `block8(row, j)` decodes elements 8j .. 8j + 8 of a weight
// row. Shared by the matmul kernels and the embedding gather, each of which defines
// `wword(i)`, word i of its weight binding, and the WEIGHT_DTYPE override.
//
// On the GPU each GGUF block is kept as it is in the file, in a whole number of 4-byte
// words (gpu_block in src/kernels/weight.rs writes that layout): two bytes of padding go
// before a Q4_0, Q5_0 or IQ4_NL block (its f16 scale then fills the upper half of word 0
// and its codes start on a word), three before an MXFP4 block (its exponent is the top byte of
// word 0), and 14 after a Q6_K block (56 words); Q3_K has its 16 six-bit scales unpacked to
// bytes (words 24..28, then d and two bytes of padding); Q4_K, Q5_K, Q2_K and IQ4_XS blocks
// are whole words as they are; Q8_0 blocks go in groups of four (q8_0_codes below). A row is
// its blocks one after another. Q4_K (36 words), Q5_K (44), Q6_K (56) and Q8_0 rows thus
// start every block's codes on a 16-byte word, and the column kernels (weights8.wgsl) read
// a group's codes 16 bytes at a time. Every 8-element group
// lies within one block and shares its scale, so a group is decoded from a few words.
//
// Values are computed with the expressions of src/formats/ggml.rs, the plain-Rust reference,
// and come out as its bits on any conforming GPU: a scale times a code (and Q4_K's and
// Q6_K's super-block scale times a sub-block scale, times a code) needs at most 22
// significant bits, so every product is exact in f32, and where a min is then added or
// subtracted (Q4_1, Q5_1, Q4_K, Q5_K) there is one rounding whether or not the compiler
// fuses the two into a multiply-add (Q2_K's min too). Q3_K's and IQ4_XS's products of a
// super-block scale, a six-bit sub-block scale and a code need at most 20 and 24 bits.
// IQ4_NL's, IQ4_XS's and MXFP4's codes index tables of small integers, times a scale: exact
// products too (MXFP4's scale is a power of two, an f32
// subnormal for exponents 0 and 1, where a GPU that flushes subnormals gives zeros).
// tests/kernels_quant.rs checks every fixture block.

const DTYPE_Q4_0: u32 = 10u;
const DTYPE_Q4_1: u32 = 11u;
const DTYPE_Q5_0: u32 = 12u;
const DTYPE_Q5_1: u32 = 13u;
const DTYPE_Q8_0: u32 = 14u;
const DTYPE_Q4_K: u32 = 15u;
const DTYPE_Q5_K: u32 = 16u;
const DTYPE_Q6_K: u32 = 17u;
const DTYPE_IQ4_NL: u32 = 18u;
const DTYPE_MXFP4: u32 = 19u;
const DTYPE_IQ4_XS: u32 = 20u;
const DTYPE_Q2_K: u32 = 21u;
const DTYPE_Q3_K: u32 = 22u;

// IQ4_NL's 16 levels (src/formats/ggml.rs's IQ4_LEVELS) as i8 bytes of four words: picked
// with selects and a bit extraction rather than an indexed array, which compilers may keep
// in memory (3x slower on lavapipe).
const IQ4_W0: u32 = 0xbfad9881u; // -127 -104 -83 -65
const IQ4_W1: u32 = 0xf6eaddcfu; //  -49  -35 -22 -10
const IQ4_W2: u32 = 0x26190d01u; //    1   13  25  38
const IQ4_W3: u32 = 0x71594535u; //   53   69  89 113

fn iq4_level(q: u32) -> f32 {
    let w = select(select(IQ4_W0, IQ4_W1, q >= 4u), select(IQ4_W2, IQ4_W3, q >= 12u), q >= 8u);
    return f32(extractBits(bitcast<i32>(w), 8u * (q & 3u), 8u));
}

// MXFP4's levels, the E2M1 values doubled: codes 0-7 are 0, 1, 2, 3, 4, 6, 8, 12, codes 8-15
// their negatives (code 8 is +0, as in the table).
fn fp4_level(q: u32) -> f32 {
    let m = q & 7u;
    let mag = select(f32((2u + (m & 1u)) << ((m >> 1u) - 1u)), f32(m), m < 4u);
    return select(mag, -mag, q > 8u);
}

// Whether WEIGHT_DTYPE is a block format.
fn is_block_dtype() -> bool {
    return WEIGHT_DTYPE >= DTYPE_Q4_0;
}

// Elements and words of one block of WEIGHT_DTYPE.
fn block_elems() -> u32 {
    let k = WEIGHT_DTYPE >= DTYPE_Q4_K && WEIGHT_DTYPE <= DTYPE_Q6_K;
    return select(32u, 256u, k || WEIGHT_DTYPE >= DTYPE_IQ4_XS);
}

fn block_words() -> u32 {
    switch WEIGHT_DTYPE {
        case 10u, 11u, 18u, 19u: { return 5u; }
        case 12u, 13u: { return 6u; }
        case 14u: { return 9u; }
        case 15u: { return 36u; }
        case 16u: { return 44u; }
        case 20u: { return 34u; }
        case 21u: { return 21u; }
        case 22u: { return 29u; }
        default: { return 56u; }
    }
}

// Words of one weight row of k elements.
fn row_words(k: u32) -> u32 {
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        let blocks = k / 32u;
        let rest = blocks % 4u;
        return (blocks / 4u) * 36u + select(0u, 4u + 8u * rest, rest != 0u);
    }
    return (k / block_elems()) * block_words();
}

// Q8_0 on the GPU: four blocks (128 elements) to a group of 36 words, as many bytes as four
// file blocks with their padding: the four f16 scales in words 0 and 1 (block b's in half
// b % 2 of word b / 2), two words of padding, then block b's 32 code bytes from word 4 + 8 b,
// each on a 16-byte word when the row is. A row whose blocks are not a multiple of four ends
// in a shorter group of the same layout (its missing scales zero, its codes only its own).
// The word of block b's codes in the row at `row`:
fn q8_0_codes(row: u32, b: u32) -> u32 {
    return row + (b / 4u) * 36u + 4u + 8u * (b % 4u);
}

// Block b's scale.
fn q8_0_scale(row: u32, b: u32) -> f32 {
    let s = unpack2x16float(wword(row + (b / 4u) * 36u + (b % 4u) / 2u));
    return select(s.x, s.y, b % 2u == 1u);
}

// Eight Q8_0 weights from their two code words and the block's scale.
fn block8_q8_0_words(q: vec2<u32>, d: f32) -> array<vec4<f32>, 2> {
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = f32(extractBits(bitcast<i32>(q[i / 4u]), 8u * (i % 4u), 8u)) * d;
    }
    return pack8(v);
}

// Byte i (0..4) of word w.
fn byte_at(w: u32, i: u32) -> u32 {
    return (w >> (8u * i)) & 0xffu;
}

// The eight 4-bit codes at bit `shift` (0 or 4) of each byte of words a, b: masked four at
// a time, then taken byte by byte.
fn nibbles8(a: u32, b: u32, shift: u32) -> array<u32, 8> {
    let a4 = (a >> shift) & 0x0f0f0f0fu;
    let b4 = (b >> shift) & 0x0f0f0f0fu;
    var q: array<u32, 8>;
    for (var i = 0u; i < 4u; i++) {
        q[i] = byte_at(a4, i);
        q[i + 4u] = byte_at(b4, i);
    }
    return q;
}

fn pack8(v: array<f32, 8>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// IQ4_NL and MXFP4: group g (0..4) of the 32-block at word `base`, a scale times levels.
fn block8_levels(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let head = wword(base);
    // Byte l of the codes holds element l (low nibble) and l + 16 (high nibble).
    let qs = base + 1u + 2u * (g % 2u);
    let q = nibbles8(wword(qs), wword(qs + 1u), 4u * (g / 2u));
    var v: array<f32, 8>;
    if WEIGHT_DTYPE == DTYPE_MXFP4 {
        // 2^(e - 128), built as ggml builds it.
        let e = head >> 24u;
        let scale = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
        for (var i = 0u; i < 8u; i++) {
            v[i] = scale * fp4_level(q[i]);
        }
        return pack8(v);
    }
    let d = unpack2x16float(head).y;
    for (var i = 0u; i < 8u; i++) {
        v[i] = d * iq4_level(q[i]);
    }
    return pack8(v);
}

// IQ4_XS: group g (0..32) of the super-block at word `base` (as the file has it: d and
// scales_h in word 0, scales_l in word 1, then sub-block s's 16 code bytes at word 2 + 4 s,
// laid out as an IQ4_NL block's).
fn block8_iq4_xs(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let head = wword(base);
    let s = g / 4u;
    let low = (wword(base + 1u) >> (4u * s)) & 0xfu;
    let high = (head >> (16u + 2u * s)) & 3u;
    let dl = unpack2x16float(head).x * f32(i32(low | (high << 4u)) - 32);
    let qs = base + 2u + 4u * s + 2u * (g % 2u);
    let q = nibbles8(wword(qs), wword(qs + 1u), 4u * ((g % 4u) / 2u));
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = dl * iq4_level(q[i]);
    }
    return pack8(v);
}

// Q2_K: group g (0..32) of the super-block at word `base` (the file's layout: 16 scale bytes
// in words 0..4, 64 code bytes in words 4..20, d and dmin in word 20): half n, elements
// 32 j + l .. + 8 of it (l = 8 (g % 4)), codes at bit 2 j of bytes 32 n + l .., in sub-block
// 8 n + 2 j + l / 16 of 16.
fn block8_q2_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let n = g / 16u;
    let j = (g % 16u) / 4u;
    let qs = base + 4u + 8u * n + 2u * (g % 4u);
    let a = wword(qs);
    let b = wword(qs + 1u);
    let si = 8u * n + 2u * j + (g % 4u) / 2u;
    let sc = byte_at(wword(base + si / 4u), si % 4u);
    let dm = unpack2x16float(wword(base + 20u));
    let dl = dm.x * f32(sc & 15u);
    let ml = dm.y * f32(sc >> 4u);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let word = select(b, a, i < 4u);
        v[i] = dl * f32((byte_at(word, i % 4u) >> (2u * j)) & 3u) - ml;
    }
    return pack8(v);
}

// Q3_K: group g (0..32) of the super-block at word `base` (high bits in words 0..8, codes in
// words 8..24 laid out as Q2_K's, the 16 scales unpacked to bytes in words 24..28, d in the
// low half of word 28): as Q2_K, the code minus 4 where its high bit (bit 4 n + j of byte l)
// is clear.
fn block8_q3_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let n = g / 16u;
    let j = (g % 16u) / 4u;
    let qs = base + 8u + 8u * n + 2u * (g % 4u);
    let a = wword(qs);
    let b = wword(qs + 1u);
    let ha = wword(base + 2u * (g % 4u));
    let hb = wword(base + 2u * (g % 4u) + 1u);
    let si = 8u * n + 2u * j + (g % 4u) / 2u;
    let sc = byte_at(wword(base + 24u + si / 4u), si % 4u);
    let dl = unpack2x16float(wword(base + 28u)).x * f32(i32(sc) - 32);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let word = select(b, a, i < 4u);
        let hword = select(hb, ha, i < 4u);
        let low = i32((byte_at(word, i % 4u) >> (2u * j)) & 3u);
        let high = (byte_at(hword, i % 4u) >> (4u * n + j)) & 1u;
        v[i] = dl * f32(select(low - 4, low, high == 1u));
    }
    return pack8(v);
}

// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: group g (0..4) of the 32-block at word `base`.
fn block8_32(base: u32, g: u32) -> array<vec4<f32>, 2> {
    return block8_32_with(base, g, unpack2x16float(wword(base)));
}

// block8_32 given the block's head (its f16 scale and min, or for Q4_0, Q5_0 and Q8_0 the
// scale in .y).
fn block8_32_with(base: u32, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    var v: array<f32, 8>;
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        // `base` is the block's first code word (q8_0_codes).
        return block8_q8_0_words(vec2<u32>(wword(base + 2u * g), wword(base + 2u * g + 1u)), head.y);
    }
    // Byte l of the codes holds element l (low nibble) and l + 16 (high nibble).
    let five = WEIGHT_DTYPE == DTYPE_Q5_0 || WEIGHT_DTYPE == DTYPE_Q5_1;
    let qs = base + select(1u, 2u, five) + 2u * (g % 2u);
    var q = nibbles8(wword(qs), wword(qs + 1u), 4u * (g / 2u));
    if five {
        let qh = wword(base + 1u);
        for (var i = 0u; i < 8u; i++) {
            q[i] |= ((qh >> (8u * g + i)) & 1u) << 4u;
        }
    }
    for (var i = 0u; i < 8u; i++) {
        switch WEIGHT_DTYPE {
            case 10u: { v[i] = f32(i32(q[i]) - 8) * head.y; }
            case 12u: { v[i] = f32(i32(q[i]) - 16) * head.y; }
            default: { v[i] = head.x * f32(q[i]) + head.y; }
        }
    }
    return pack8(v);
}

// Q4_K and Q5_K: group g (0..32) of the super-block at word `base` (the file's layout: d and
// dmin in word 0, the twelve bytes of packed 6-bit scales and mins in words 1..4, for Q5_K
// the 32 high-bit bytes in words 4..12, then the 128 code bytes): sub-block s = g / 4,
// elements l .. l + 8 of it, l = 8 (g % 4).
fn block8_k_asym(base: u32, g: u32) -> array<vec4<f32>, 2> {
    return block8_k_asym_with(base, g, k_asym_head(base, g));
}

// The scale and min of group g's sub-block in a Q4_K or Q5_K super-block.
fn k_asym_head(base: u32, g: u32) -> vec2<f32> {
    let top = vec4<u32>(wword(base), wword(base + 1u), wword(base + 2u), wword(base + 3u));
    return k_asym_scale_min(top, g);
}

// k_asym_head from the super-block's first 16 bytes `top` (d and dmin, the packed scales):
// sub-block s's 6-bit scale and min as src/formats/ggml.rs's k_scale_min unpacks them, times
// d and dmin.
fn k_asym_scale_min(top: vec4<u32>, g: u32) -> vec2<f32> {
    let dm = unpack2x16float(top.x);
    let s = g / 4u;
    var sc: u32;
    var m: u32;
    if s < 4u {
        sc = k_scale_byte(top, s) & 63u;
        m = k_scale_byte(top, s + 4u) & 63u;
    } else {
        let b = k_scale_byte(top, s + 4u);
        sc = (b & 15u) | ((k_scale_byte(top, s - 4u) >> 6u) << 4u);
        m = (b >> 4u) | ((k_scale_byte(top, s) >> 6u) << 4u);
    }
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}

// Byte i (0..12) of the packed scales in a K super-block's first 16 bytes.
fn k_scale_byte(top: vec4<u32>, i: u32) -> u32 {
    return byte_at(top[1u + i / 4u], i % 4u);
}

// Word of group g's two code words (`qs`) and, for Q5_K, two high-bit words (`qh`) in the
// super-block at `base`: for an even g each is the first half of a 16-byte word when `base`
// is on one (rows of whole blocks from a 16-byte boundary; Q4_K's 36 and Q5_K's 44 words are
// multiples of 4), and g + 1's are the second halves of the same 16-byte words.
fn k_asym_words(base: u32, g: u32) -> vec2<u32> {
    let s = g / 4u;
    let five = WEIGHT_DTYPE == DTYPE_Q5_K;
    // Nibble byte l of sub-block s: byte 32 (s / 2) + l of the codes, half s % 2.
    return vec2<u32>(base + select(4u, 12u, five) + 8u * (s / 2u) + 2u * (g % 4u), base + 4u + 2u * (g % 4u));
}

// block8_k_asym given k_asym_head's scale and min.
fn block8_k_asym_with(base: u32, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    let at = k_asym_words(base, g);
    let qs = vec2<u32>(wword(at.x), wword(at.x + 1u));
    var qh = vec2<u32>(0u);
    if WEIGHT_DTYPE == DTYPE_Q5_K {
        qh = vec2<u32>(wword(at.y), wword(at.y + 1u));
    }
    return block8_k_asym_words(qs, qh, g, head);
}

// Group g's eight weights from its code words `qs`, high-bit words `qh` (Q5_K) and its
// sub-block's scale and min.
fn block8_k_asym_words(qs: vec2<u32>, qh: vec2<u32>, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    let s = g / 4u;
    var q = nibbles8(qs.x, qs.y, 4u * (s % 2u));
    if WEIGHT_DTYPE == DTYPE_Q5_K {
        // Bit s of high-bit byte l.
        for (var i = 0u; i < 4u; i++) {
            q[i] |= ((byte_at(qh.x, i) >> s) & 1u) << 4u;
            q[i + 4u] |= ((byte_at(qh.y, i) >> s) & 1u) << 4u;
        }
    }
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = head.x * f32(q[i]) - head.y;
    }
    return pack8(v);
}

// Q6_K: group g (0..32) of the super-block at word `base` (quant.rs's dequant_q6_k spells out
// the layout): half h, elements e .. e + 8 of it, in quarter k at position l.
fn block8_q6_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let dl = q6_k_scale(base, g);
    let six = q6_k_codes(base, g);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = dl * f32(i32(byte_at(six[i / 4u], i % 4u)) - 32);
    }
    return pack8(v);
}

// The scale of group g's sub-block of 16 in a Q6_K super-block.
fn q6_k_scale(base: u32, g: u32) -> f32 {
    let si = 8u * (g / 16u) + (8u * (g % 16u)) / 16u;
    let sc = extractBits(bitcast<i32>(wword(base + 48u + si / 4u)), 8u * (si % 4u), 8u);
    let d = unpack2x16float(wword(base + 52u)).x;
    return d * f32(sc);
}

// The words of group g's low code bits (x) and high code bits (y) in the Q6_K super-block at
// word `base`: two words from each. For an even g both are the first of a 16-byte word when
// `base` is (56-word blocks from a 16-byte boundary), and g + 1's are the second halves of
// the same two 16-byte words.
fn q6_k_words(base: u32, g: u32) -> vec2<u32> {
    let h = g / 16u;
    let e = 8u * (g % 16u);
    let k = e / 32u;
    let l = e % 32u;
    return vec2<u32>(base + 16u * h + 8u * (k % 2u) + l / 4u, base + 32u + 8u * h + l / 4u);
}

// Each of group g's eight six-bit codes, four to a word, from its two words of low bits `ql`
// and two of high bits `qh`: its low nibble (at bit 4 (k / 2) of its code byte, k the
// quarter) and above it its two high bits (at bit 2 k of its high byte), assembled in place
// a word at a time (no bits cross a byte).
fn q6_k_six(ql: vec2<u32>, qh: vec2<u32>, g: u32) -> array<u32, 2> {
    let k = (g % 16u) / 4u;
    let shift = 4u * (k / 2u);
    return array<u32, 2>(
        ((ql.x >> shift) & 0x0f0f0f0fu) | (((qh.x >> (2u * k)) & 0x03030303u) << 4u),
        ((ql.y >> shift) & 0x0f0f0f0fu) | (((qh.y >> (2u * k)) & 0x03030303u) << 4u),
    );
}

fn q6_k_codes(base: u32, g: u32) -> array<u32, 2> {
    let at = q6_k_words(base, g);
    let ql = vec2<u32>(wword(at.x), wword(at.x + 1u));
    return q6_k_six(ql, vec2<u32>(wword(at.y), wword(at.y + 1u)), g);
}

// block8_q6_k given q6_k_scale's scale.
fn block8_q6_k_with(base: u32, g: u32, dl: f32) -> array<vec4<f32>, 2> {
    return block8_q6_k_six(q6_k_codes(base, g), dl);
}

// The eight weights of codes `six` (q6_k_six) and scale dl, for the kernels that take dot
// products of them: dl (q - 32) computed as dl q - 32 dl. Both products are exact (dl has at
// most 18 significant bits, q 6), so their difference is exact too and equals block8_q6_k's
// value, but for the sign of a zero (+0 here where dl < 0 gives -0 there), which a dot
// product that starts at +0 cannot tell apart: the dot products are the same bits.
fn block8_q6_k_six(six: array<u32, 2>, dl: f32) -> array<vec4<f32>, 2> {
    let off = -32.0 * dl;
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = f32(byte_at(six[i / 4u], i % 4u)) * dl + off;
    }
    return pack8(v);
}

// Elements 8j .. 8j + 8 of the weight row that starts at word `row`.
fn block8(row: u32, j: u32) -> array<vec4<f32>, 2> {
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        return block8_32_with(q8_0_codes(row, j / 4u), j % 4u, vec2<f32>(0.0, q8_0_scale(row, j / 4u)));
    }
    let per_block = block_elems() / 8u;
    let base = row + (j / per_block) * block_words();
    let g = j % per_block;
    if WEIGHT_DTYPE == DTYPE_Q3_K {
        return block8_q3_k(base, g);
    }
    if WEIGHT_DTYPE == DTYPE_Q2_K {
        return block8_q2_k(base, g);
    }
    if WEIGHT_DTYPE == DTYPE_IQ4_XS {
        return block8_iq4_xs(base, g);
    }
    if WEIGHT_DTYPE >= DTYPE_IQ4_NL {
        return block8_levels(base, g);
    }
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        return block8_q6_k(base, g);
    }
    if WEIGHT_DTYPE >= DTYPE_Q4_K {
        return block8_k_asym(base, g);
    }
    return block8_32(base, g);
}

// A block format's group constants (a scale, and a min where it has one) stay the same for
// head_steps() consecutive steps j of 8 weights from a multiple of it: a kernel that steps
// through a row computes them once per group with block_head and decodes each step with
// block8_with, which gives block8's values bit for bit (the same expressions, computed
// once instead of at every step). Formats whose steps each need their own (Q2_K, Q3_K,
// IQ4_XS, IQ4_NL, MXFP4) and float formats have one step per head, which is then unused.
// Q4_K, Q5_K and Q6_K groups are two steps, whose codes lie in the halves of the same
// 16-byte words (weights8.wgsl's Head holds those).
fn head_steps() -> u32 {
    switch WEIGHT_DTYPE {
        case 10u, 11u, 12u, 13u: { return 4u; }
        case 14u, 15u, 16u, 17u: { return 2u; }
        default: { return 1u; }
    }
}

// The group constants of elements 8j .. 8j + 8 of the weight row at word `row`.
fn block_head(row: u32, j: u32) -> vec2<f32> {
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        return vec2<f32>(0.0, q8_0_scale(row, j / 4u));
    }
    let per_block = block_elems() / 8u;
    let base = row + (j / per_block) * block_words();
    let g = j % per_block;
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        return vec2<f32>(q6_k_scale(base, g), 0.0);
    }
    if WEIGHT_DTYPE == DTYPE_Q4_K || WEIGHT_DTYPE == DTYPE_Q5_K {
        return k_asym_head(base, g);
    }
    if WEIGHT_DTYPE >= DTYPE_Q4_0 && WEIGHT_DTYPE <= DTYPE_Q8_0 {
        return unpack2x16float(wword(base));
    }
    return vec2<f32>(0.0);
}

// block8(row, j) given block_head(row, j') for the first step j' of j's group.
fn block8_with(row: u32, j: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        return block8_32_with(q8_0_codes(row, j / 4u), j % 4u, head);
    }
    let per_block = block_elems() / 8u;
    let base = row + (j / per_block) * block_words();
    let g = j % per_block;
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        return block8_q6_k_with(base, g, head.x);
    }
    if WEIGHT_DTYPE == DTYPE_Q4_K || WEIGHT_DTYPE == DTYPE_Q5_K {
        return block8_k_asym_with(base, g, head);
    }
    if WEIGHT_DTYPE >= DTYPE_Q4_0 && WEIGHT_DTYPE <= DTYPE_Q8_0 {
        return block8_32_with(base, g, head);
    }
    return block8(row, j);
}
