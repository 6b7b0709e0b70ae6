// Float32 products for XLA:CPU through its FFI (custom calls), for
// benchmarks/ffi_gemm_step.py: TxFfiGemm, C [M, N] = op(A) · op(B), row-major, op = transpose
// or not; TxFfiBatchedGemm, the same for each item of a batch [batch, ...] (attention's).
//
// mode 0: numpy's bundled OpenBLAS (its cblas_sgemm, set by tx_ffi_gemm_set_sgemm), the
//         rows (or columns, whichever are more) of C split into one part per thread of
//         XLA's intra-op pool, each part one-threaded in OpenBLAS: OpenBLAS's own threads
//         would spin beside XLA's and slow the rest of the step.
// mode 1: nothing: C keeps whatever its buffer held. The step's time without its products.
// mode 2: MKL's sgemm as PyTorch's CPU wheel carries it (libtorch_cpu's Fortran `sgemm`, set by
//         tx_ffi_gemm_set_mkl), one call on its own OpenMP threads, as torch.mm runs it.
// mode 3: the same MKL, split over XLA's pool like mode 0, each part one-threaded.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// cblas_sgemm of an OpenBLAS built with 64-bit integers (numpy's scipy-openblas64).
using Sgemm = void (*)(int order, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float beta, float* c, int64_t ldc);
using SetThreadsLocal = int (*)(int threads);

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
Sgemm sgemm = nullptr;
SetThreadsLocal set_threads_local = nullptr;
// Fortran sgemm of MKL's LP64 interface (column-major, 32-bit integers, arguments by pointer)
using FortranSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m,
                              const int* n, const int* k, const float* alpha, const float* a,
                              const int* lda, const float* b, const int* ldb, const float* beta,
                              float* c, const int* ldc);
FortranSgemm mkl_sgemm = nullptr;
SetThreadsLocal mkl_threads_local = nullptr;

// Row-major C [m, n] = op(A) · op(B) through a column-major GEMM: Cᵀ = op(B)ᵀ · op(A)ᵀ, the
// operands swapped and each flag kept.
void MklRowMajor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int im = m, in = n, ik = k, ilda = lda, ildb = ldb, ildc = ldc;
  const float one = 1.0f, zero = 0.0f;
  mkl_sgemm(&tb, &ta, &in, &im, &ik, &one, b, &ildb, a, &ilda, &zero, c, &ildc);
}

// One 2-D product's operands, row-major: a [rows, cols] holds op(A) [m, k], b op(B) [k, n].
struct Operands {
  const float* a;
  const float* b;
  float* c;
  int64_t m, n, k, lda, ldb;
  bool trans_a, trans_b;
  int64_t part, parts;  // the work split into `parts` of `part` rows, columns or items
  std::atomic<int64_t> next{0}, done{0};

  void Set(const float* a_in, int64_t a_rows, int64_t a_cols, const float* b_in, int64_t b_rows,
           int64_t b_cols, float* c_out, bool transpose_a, bool transpose_b) {
    a = a_in, b = b_in, c = c_out, trans_a = transpose_a, trans_b = transpose_b;
    m = trans_a ? a_cols : a_rows;
    k = trans_a ? a_rows : a_cols;
    n = trans_b ? b_rows : b_cols;
    lda = a_cols;
    ldb = b_cols;
  }
};

// Runs p->Work() on the caller and p->parts - 1 tasks of XLA's pool, and waits for all parts.
template <typename Parts>
void RunParts(ffi::ThreadPool& pool, std::shared_ptr<Parts> p) {
  for (int64_t i = 1; i < p->parts; ++i) pool.Schedule([p] { p->Work(); });
  p->Work();
  while (p->done.load() < p->parts) std::this_thread::yield();
}

struct Product : Operands {
  bool split_rows, mkl = false;

  void Run(int64_t i) {
    int64_t lo = i * part, hi = std::min(split_rows ? m : n, lo + part);
    const float* a0 = split_rows ? (trans_a ? a + lo : a + lo * lda) : a;
    const float* b0 = split_rows ? b : (trans_b ? b + lo * ldb : b + lo);
    int64_t rows = split_rows ? hi - lo : m, cols = split_rows ? n : hi - lo;
    float* c0 = split_rows ? c + lo * n : c + lo;
    if (mkl) {
      MklRowMajor(trans_a, trans_b, rows, cols, k, a0, lda, b0, ldb, c0, n);
    } else {
      sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, rows, cols, k,
            1.0f, a0, lda, b0, ldb, 0.0f, c0, n);
    }
  }

  // Claims parts until none are left: a pool task that starts late finds nothing to do,
  // so the caller never waits on a part that no thread has begun.
  void Work() {
    SetThreadsLocal one_thread = mkl ? mkl_threads_local : set_threads_local;
    if (one_thread != nullptr) one_thread(1);
    for (int64_t i; (i = next.fetch_add(1)) < parts;) {
      Run(i);
      done.fetch_add(1);
    }
  }
};

ffi::Error Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                ffi::ResultBuffer<ffi::F32> c, bool trans_a, bool trans_b, int32_t mode) {
  if (mode == 1) return ffi::Error::Success();
  bool mkl = mode == 2 || mode == 3;
  if (mkl ? mkl_sgemm == nullptr : sgemm == nullptr) {
    return ffi::Error::InvalidArgument("tx_ffi_gemm: no sgemm was set for this mode");
  }
  auto da = a.dimensions(), db = b.dimensions();
  auto p = std::make_shared<Product>();
  p->Set(a.typed_data(), da[0], da[1], b.typed_data(), db[0], db[1], c->typed_data(), trans_a,
         trans_b);
  p->mkl = mkl;
  if (mode == 2) {  // one call, MKL's own threads (its default: OMP_NUM_THREADS)
    if (mkl_threads_local != nullptr) mkl_threads_local(0);
    MklRowMajor(trans_a, trans_b, p->m, p->n, p->k, p->a, p->lda, p->b, p->ldb, p->c, p->n);
    return ffi::Error::Success();
  }
  p->split_rows = p->m >= p->n;
  int64_t extent = p->split_rows ? p->m : p->n;
  // one part per thread, but none under ~1 MFLOP, in multiples of 16 rows / columns
  int64_t parts = std::min<int64_t>(std::max<int64_t>(1, pool.num_threads()),
                                    std::max<int64_t>(1, 2 * p->m * p->n * p->k >> 20));
  p->part = ((extent + parts - 1) / parts + 15) / 16 * 16;
  p->parts = (extent + p->part - 1) / p->part;
  RunParts(pool, p);
  return ffi::Error::Success();
}


// A batch of products c[i] = op(a[i]) · op(b[i]), a [batch, M, K] (or [batch, K, M]), b
// [batch, K, N] (or [batch, N, K]): the batch split into one part per thread of XLA's pool,
// each product one-threaded (attention's per-head products are too small to split).
struct Batch : Operands {
  int64_t stride_a, stride_b, items;

  void Work() {
    if (set_threads_local != nullptr) set_threads_local(1);
    for (int64_t i; (i = next.fetch_add(1)) < parts;) {
      for (int64_t j = i * part; j < std::min(items, (i + 1) * part); ++j) {
        sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, 1.0f,
              a + j * stride_a, lda, b + j * stride_b, ldb, 0.0f, c + j * m * n, n);
      }
      done.fetch_add(1);
    }
  }
};

// [batch, rows, columns]; an alias, as the binding macro below splits on commas
using Items = ffi::Buffer<ffi::F32, 3>;

ffi::Error BatchedGemm(ffi::ThreadPool pool, Items a, Items b, ffi::Result<Items> c,
                       bool trans_a, bool trans_b, int32_t mode) {
  if (mode == 1) return ffi::Error::Success();
  if (mode != 0) return ffi::Error::InvalidArgument("tx_ffi_batched_gemm: modes 0 and 1 only");
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("tx_ffi_gemm: no sgemm was set");
  auto da = a.dimensions(), db = b.dimensions();
  auto p = std::make_shared<Batch>();
  p->Set(a.typed_data(), da[1], da[2], b.typed_data(), db[1], db[2], c->typed_data(), trans_a,
         trans_b);
  p->items = da[0];
  p->stride_a = da[1] * da[2];
  p->stride_b = db[1] * db[2];
  p->parts = std::min<int64_t>(std::max<int64_t>(1, pool.num_threads()), p->items);
  p->part = (p->items + p->parts - 1) / p->parts;
  p->parts = (p->items + p->part - 1) / p->part;
  RunParts(pool, p);
  return ffi::Error::Success();
}

}  // namespace

extern "C" void tx_ffi_gemm_set_sgemm(void* cblas_sgemm, void* set_num_threads_local) {
  sgemm = reinterpret_cast<Sgemm>(cblas_sgemm);
  set_threads_local = reinterpret_cast<SetThreadsLocal>(set_num_threads_local);
}

extern "C" void tx_ffi_gemm_set_mkl(void* fortran_sgemm, void* set_num_threads_local) {
  mkl_sgemm = reinterpret_cast<FortranSgemm>(fortran_sgemm);
  mkl_threads_local = reinterpret_cast<SetThreadsLocal>(set_num_threads_local);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxFfiGemm, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<int32_t>("mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxFfiBatchedGemm, BatchedGemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Items>()
                                  .Arg<Items>()
                                  .Ret<Items>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<int32_t>("mode"));
