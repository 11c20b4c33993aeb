// Shared by rotate_rows.wgsl and rotate_qk.wgsl: the fixed orthogonal rotation R = H D of
// one row of head_dim values, or its inverse D H. D flips the sign of element i when bit
// 31 of i * 0x9E3779B1 is set; H is the normalized Walsh-Hadamard transform, applied
// block-diagonally to the descending powers of two that head_dim is the sum of (80 =
// 64 + 16). Rotating keys and queries alike leaves q . k unchanged; what changes is that
// each cached key's outlier channels are spread over its block before it is quantized. src/reference/mod.rs (`rotate_rows`) is the plain-Rust version.
// One workgroup of 64 rotates MAX_HEAD_DIM / head_dim rows at once in workgroup memory,
// so that each barrier serves several rows. (One invocation per row, with the row in a
// private array, avoids the barriers but takes llvmpipe's GL driver over a minute to
// compile.)

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;

var<workgroup> r: array<f32, MAX_HEAD_DIM>;

fn flip(i: u32) -> f32 {
    return select(1.0, -1.0, ((i * 0x9E3779B1u) >> 31u) == 1u);
}

// Rows one workgroup rotates.
fn rows_per_group(head_dim: u32) -> u32 {
    return MAX_HEAD_DIM / head_dim;
}

// Rotates the rows r[j * head_dim ..][..head_dim] for j < rows_per_group. The caller has
// filled r (with D applied when not inverting) and issued a barrier; on return r holds H of
// each row, published by a barrier.
fn hadamard_shared(tid: u32, head_dim: u32) {
    let rows = rows_per_group(head_dim);
    var off = 0u;
    var rest = head_dim;
    while rest > 1u {
        // n = 2^ln, the largest power of two in rest; divisions below are shifts.
        let ln = 31u - countLeadingZeros(rest);
        let n = 1u << ln;
        for (var lh = 0u; lh < ln; lh++) {
            let h = 1u << lh;
            for (var k = tid; k < rows * (n >> 1u); k += WG) {
                let j = k >> (ln - 1u);
                let kk = k & ((n >> 1u) - 1u);
                let i = j * head_dim + off + ((kk >> lh) << (lh + 1u)) + (kk & (h - 1u));
                let a = r[i];
                let b = r[i + h];
                r[i] = a + b;
                r[i + h] = a - b;
            }
            workgroupBarrier();
        }
        let s = 1.0 / sqrt(f32(n));
        for (var k = tid; k < rows * n; k += WG) {
            r[(k >> ln) * head_dim + off + (k & (n - 1u))] *= s;
        }
        off += n;
        rest -= n;
    }
    workgroupBarrier();
}

fn row_index(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y * nwg.x + wg.x;
}
