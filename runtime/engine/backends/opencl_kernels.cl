// edgerun OpenCL kernels. Compiled once per session with:
//   -DSTORE_HALF=0|1   activations and weights stored as fp32 or fp16 (math is fp32 either
//                      way; fp16 storage needs no cl_khr_fp16: vload_half/vstore_half are core)
//   -DOCB=4            output channels per work-item in the direct convolution
#if STORE_HALF
  #define T half
  #define LD(p, i) vload_half((i), (p))
  #define ST(p, i, v) vstore_half((v), (i), (p))
#else
  #define T float
  #define LD(p, i) ((p)[(i)])
  #define ST(p, i, v) ((p)[(i)] = (v))
#endif

// act: 0 none, 1 relu, 2 clip(a,b), 3 leakyrelu(a), 4 sigmoid, 5 hardsigmoid(a,b), 6 hardswish
inline float activate(float x, int act, float a, float b) {
  switch (act) {
    case 1: return fmax(x, 0.0f);
    case 2: return fmin(fmax(x, a), b);
    case 3: return x >= 0.0f ? x : a * x;
    case 4: return 1.0f / (1.0f + exp(-x));
    case 5: return fmin(fmax(a * x + b, 0.0f), 1.0f);
    case 6: return x * fmin(fmax(x / 6.0f + 0.5f, 0.0f), 1.0f);
    default: return x;
  }
}

// Direct convolution, NCHW. One work-item: one output pixel (ox, oy) of OCB consecutive
// output channels of one group, so each input value loaded is reused OCB times from registers.
// global = (OW, OH, N * G * ceil(OCg / OCB))
__kernel void conv2d(__global const T* x, __global const T* w, __global const T* bias,
                     __global T* y,
                     int C, int H, int W, int OC, int OH, int OW, int KH, int KW,
                     int SH, int SW, int PT, int PL, int DH, int DW, int G,
                     int act, float a, float b) {
  const int ox = get_global_id(0), oy = get_global_id(1), z = get_global_id(2);
  if (ox >= OW || oy >= OH) return;
  const int Cg = C / G, OCg = OC / G, blocks = (OCg + OCB - 1) / OCB;
  const int n = z / (G * blocks), rem = z % (G * blocks), g = rem / blocks;
  const int oc0 = g * OCg + (rem % blocks) * OCB;
  const int ocn = min(OCB, g * OCg + OCg - oc0);
  float acc[OCB];
  for (int k = 0; k < OCB; k++) acc[k] = k < ocn ? LD(bias, oc0 + k) : 0.0f;
  const int iy0 = oy * SH - PT, ix0 = ox * SW - PL;
  for (int ic = 0; ic < Cg; ic++) {
    const int cin = g * Cg + ic;
    __global const T* xc = x + ((size_t)(n * C + cin) * H) * W;
    for (int ky = 0; ky < KH; ky++) {
      const int iy = iy0 + ky * DH;
      if (iy < 0 || iy >= H) continue;
      for (int kx = 0; kx < KW; kx++) {
        const int ix = ix0 + kx * DW;
        if (ix < 0 || ix >= W) continue;
        const float v = LD(xc, iy * W + ix);
        const int wi = (ic * KH + ky) * KW + kx;
        for (int k = 0; k < OCB; k++)
          if (k < ocn) acc[k] += v * LD(w, (size_t)(oc0 + k) * Cg * KH * KW + wi);
      }
    }
  }
  for (int k = 0; k < ocn; k++)
    ST(y, ((size_t)(n * OC + oc0 + k) * OH + oy) * OW + ox, activate(acc[k], act, a, b));
}

// Depthwise 3x3-style convolution (groups == C == OC): one work-item per output value; the
// filter of the channel is small enough to stay in registers.
// global = (OW, OH, N * C)
__kernel void conv_dw(__global const T* x, __global const T* w, __global const T* bias,
                      __global T* y, int C, int H, int W, int OH, int OW, int KH, int KW,
                      int SH, int SW, int PT, int PL, int DH, int DW,
                      int act, float a, float b) {
  const int ox = get_global_id(0), oy = get_global_id(1), z = get_global_id(2);
  if (ox >= OW || oy >= OH) return;
  const int c = z % C;
  __global const T* xc = x + (size_t)z * H * W;
  float acc = LD(bias, c);
  for (int ky = 0; ky < KH; ky++) {
    const int iy = oy * SH - PT + ky * DH;
    if (iy < 0 || iy >= H) continue;
    for (int kx = 0; kx < KW; kx++) {
      const int ix = ox * SW - PL + kx * DW;
      if (ix < 0 || ix >= W) continue;
      acc += LD(xc, iy * W + ix) * LD(w, (c * KH + ky) * KW + kx);
    }
  }
  ST(y, ((size_t)z * OH + oy) * OW + ox, activate(acc, act, a, b));
}

// Pointwise (1x1, stride 1, no padding, groups 1) convolution as a tiled matrix product:
// Y[oc, p] = sum_c Wt[oc, c] * X[c, p]. Tiles of TS x TS in local memory.
// global = (ceil(P/TS)*TS, ceil(OC/TS)*TS, N), local = (TS, TS, 1)
#define TS 8
__kernel void conv_1x1(__global const T* x, __global const T* w, __global const T* bias,
                       __global T* y, int C, int P, int OC, int act, float a, float b) {
  const int p = get_global_id(0), oc = get_global_id(1), n = get_global_id(2);
  const int lp = get_local_id(0), loc = get_local_id(1);
  __local float xs[TS][TS];
  __local float ws[TS][TS];
  __global const T* xn = x + (size_t)n * C * P;
  float acc = 0.0f;
  for (int c0 = 0; c0 < C; c0 += TS) {
    const int cx = c0 + loc, cw = c0 + lp;
    xs[loc][lp] = (cx < C && p < P) ? LD(xn, (size_t)cx * P + p) : 0.0f;
    ws[loc][lp] = (oc < OC && cw < C) ? LD(w, (size_t)oc * C + cw) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TS; k++) acc += ws[loc][k] * xs[k][lp];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (p < P && oc < OC)
    ST(y, ((size_t)n * OC + oc) * P + p, activate(acc + LD(bias, oc), act, a, b));
}

// Elementwise activation, in place or not. global = (count)
__kernel void act_map(__global const T* x, __global T* y, int count, int act, float a, float b) {
  const int i = get_global_id(0);
  if (i < count) ST(y, i, activate(LD(x, i), act, a, b));
}

// Binary op with broadcasting over up to 4 dims (strides 0 on broadcast axes).
// op: 0 add, 1 mul. global = (count)
__kernel void binary(__global const T* x, __global const T* z, __global T* y, int count,
                     int d1, int d2, int d3, int4 sx, int4 sz, int op, int act) {
  const int i = get_global_id(0);
  if (i >= count) return;
  const int i3 = i % d3, i2 = (i / d3) % d2, i1 = (i / (d3 * d2)) % d1, i0 = i / (d3 * d2 * d1);
  const float u = LD(x, i0 * sx.s0 + i1 * sx.s1 + i2 * sx.s2 + i3 * sx.s3);
  const float v = LD(z, i0 * sz.s0 + i1 * sz.s1 + i2 * sz.s2 + i3 * sz.s3);
  ST(y, i, activate(op == 0 ? u + v : u * v, act, 0.0f, 0.0f));
}

// Max (mode 0) or average (mode 1) pooling, NCHW. global = (OW, OH, N*C)
__kernel void pool2d(__global const T* x, __global T* y, int H, int W, int OH, int OW, int KH,
                     int KW, int SH, int SW, int PT, int PL, int PB, int PR, int DH, int DW,
                     int mode, int count_pad) {
  const int ox = get_global_id(0), oy = get_global_id(1), z = get_global_id(2);
  if (ox >= OW || oy >= OH) return;
  __global const T* xc = x + (size_t)z * H * W;
  float acc = mode == 0 ? -INFINITY : 0.0f;
  int n = 0;
  for (int ky = 0; ky < KH; ky++) {
    const int iy = oy * SH - PT + ky * DH;
    for (int kx = 0; kx < KW; kx++) {
      const int ix = ox * SW - PL + kx * DW;
      const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
      if (inside) {
        const float v = LD(xc, iy * W + ix);
        acc = mode == 0 ? fmax(acc, v) : acc + v;
        n++;
      } else if (count_pad && iy < H + PB && ix < W + PR) {
        n++;  // padded position counted (ONNX count_include_pad), value 0
      }
    }
  }
  ST(y, ((size_t)z * OH + oy) * OW + ox, mode == 0 ? acc : acc / (float)max(n, 1));
}

// Global average pool: one work-group per (n, c), reduction in local memory.
// global = (N*C*LS), local = (LS)
__kernel void global_avg(__global const T* x, __global T* y, int HW, __local float* scratch) {
  const int z = get_group_id(0), l = get_local_id(0), ls = get_local_size(0);
  __global const T* xc = x + (size_t)z * HW;
  float s = 0.0f;
  for (int i = l; i < HW; i += ls) s += LD(xc, i);
  scratch[l] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = ls / 2; step > 0; step >>= 1) {
    if (l < step) scratch[l] += scratch[l + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (l == 0) ST(y, z, scratch[0] / (float)HW);
}

// Y[m, n] = alpha * A[m, :] . B[:, n] (B given as [K, N], or [N, K] when transB) + beta * C.
// C broadcast: cmode 0 none, 1 per column (N), 2 full (M x N). global = (N, M)
__kernel void gemm(__global const T* A, __global const T* B, __global const T* Cb,
                   __global T* Y, int M, int N, int K, int transA, int transB, float alpha,
                   float beta, int cmode) {
  const int n = get_global_id(0), m = get_global_id(1);
  if (n >= N || m >= M) return;
  float acc = 0.0f;
  for (int k = 0; k < K; k++) {
    const float av = transA ? LD(A, k * M + m) : LD(A, m * K + k);
    const float bv = transB ? LD(B, n * K + k) : LD(B, k * N + n);
    acc += av * bv;
  }
  acc *= alpha;
  if (cmode == 1) acc += beta * LD(Cb, n);
  else if (cmode == 2) acc += beta * LD(Cb, m * N + n);
  ST(Y, m * N + n, acc);
}

// Softmax over the last axis of [rows, cols]. One work-item per row (rows are short here).
__kernel void softmax(__global const T* x, __global T* y, int rows, int cols) {
  const int r = get_global_id(0);
  if (r >= rows) return;
  __global const T* xr = x + (size_t)r * cols;
  float mx = -INFINITY;
  for (int i = 0; i < cols; i++) mx = fmax(mx, LD(xr, i));
  float s = 0.0f;
  for (int i = 0; i < cols; i++) s += exp(LD(xr, i) - mx);
  for (int i = 0; i < cols; i++) ST(y, (size_t)r * cols + i, exp(LD(xr, i) - mx) / s);
}

// Concat: copy one input [outer, inner] into its slice of the output [outer, total].
__kernel void concat_copy(__global const T* x, __global T* y, int outer, int inner, int total,
                          int offset) {
  const int i = get_global_id(0);
  if (i >= outer * inner) return;
  const int o = i / inner, k = i % inner;
  ST(y, (size_t)o * total + offset + k, LD(x, i));
}

// Frame preprocessing: uint8 HxWx3 (BGR) -> NCHW tensor, resized (mode 0 bilinear with
// half-pixel centres as cv2.INTER_LINEAR, 1 nearest as cv2.INTER_NEAREST), colour order,
// (v * scale - mean) / std. global = (OW, OH)
__kernel void preprocess(__global const uchar* src, __global T* y, int H, int W, int OH, int OW,
                         int mode, int swap_rb, float scale, float3 mean, float3 inv_std) {
  const int ox = get_global_id(0), oy = get_global_id(1);
  if (ox >= OW || oy >= OH) return;
  const float fx = (float)W / OW, fy = (float)H / OH;
  float3 v;
  if (mode == 1) {
    const int sx = min((int)floor(ox * fx), W - 1), sy = min((int)floor(oy * fy), H - 1);
    __global const uchar* p = src + (sy * W + sx) * 3;
    v = (float3)(p[0], p[1], p[2]);
  } else {
    float sx = (ox + 0.5f) * fx - 0.5f, sy = (oy + 0.5f) * fy - 0.5f;
    int x0 = (int)floor(sx), y0 = (int)floor(sy);
    float ax = sx - x0, ay = sy - y0;
    if (x0 < 0) { x0 = 0; ax = 0.0f; }
    if (y0 < 0) { y0 = 0; ay = 0.0f; }
    if (x0 >= W - 1) { x0 = W - 1; ax = 0.0f; }
    if (y0 >= H - 1) { y0 = H - 1; ay = 0.0f; }
    const int x1 = min(x0 + 1, W - 1), y1 = min(y0 + 1, H - 1);
    __global const uchar* p00 = src + (y0 * W + x0) * 3;
    __global const uchar* p01 = src + (y0 * W + x1) * 3;
    __global const uchar* p10 = src + (y1 * W + x0) * 3;
    __global const uchar* p11 = src + (y1 * W + x1) * 3;
    const float3 t = (1 - ax) * (float3)(p00[0], p00[1], p00[2])
                   + ax * (float3)(p01[0], p01[1], p01[2]);
    const float3 u = (1 - ax) * (float3)(p10[0], p10[1], p10[2])
                   + ax * (float3)(p11[0], p11[1], p11[2]);
    v = (1 - ay) * t + ay * u;
  }
  if (swap_rb) v = v.zyx;
  v = (v * scale - mean) * inv_std;
  const int plane = OH * OW, i = oy * OW + ox;
  ST(y, i, v.x);
  ST(y, plane + i, v.y);
  ST(y, 2 * plane + i, v.z);
}
