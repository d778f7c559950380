// The PTX of Baton's device kernels, loaded at run time with cuModuleLoadDataEx so that the
// build needs no nvcc step. Produced from this CUDA C with `nvcc -ptx -arch=compute_75 -O3`
// (CUDA 13.0), then lowered to `.version 7.0` / `.target sm_70` so that any driver since
// CUDA 11.0 can JIT it for any GPU since Volta (the instructions used exist in PTX 6.0):
//
//   extern "C" __global__ void baton_scrub_headers(unsigned char* base,
//       unsigned long long block_bytes, unsigned int header_words, unsigned int block_count) {
//     unsigned long long total = (unsigned long long)header_words * block_count;
//     for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//          i < total; i += (unsigned long long)gridDim.x * blockDim.x) {
//       unsigned long long block = i / header_words;
//       unsigned long long word = i - block * header_words;
//       reinterpret_cast<unsigned int*>(base + block * block_bytes)[word] = 0u;
//     }
//   }
//   extern "C" __global__ void baton_spin(volatile unsigned long long* counter,
//       volatile unsigned int* header, unsigned int header_words,
//       unsigned long long iterations) {
//     if (blockIdx.x != 0 || threadIdx.x != 0) return;
//     for (unsigned long long n = 1; n <= iterations; ++n) {
//       for (unsigned int w = 0; w < header_words; ++w) header[w] = 0xBADC0DEu;
//       *counter = n;
//       __threadfence_system();
//     }
//   }
//   extern "C" __global__ void baton_fill_u32(unsigned int* dst, unsigned long long words,
//       unsigned int seed) {
//     for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//          i < words; i += (unsigned long long)gridDim.x * blockDim.x) {
//       dst[i] = (unsigned int)(i * 2654435761ull) ^ seed;
//     }
//   }
#include "cuda/kernels/kernels_ptx.h"

namespace baton {

const char kBatonKernelsPtx[] = R"PTX(
.version 7.0
.target sm_70
.address_size 64

	// .globl	baton_scrub_headers

.visible .entry baton_scrub_headers(
	.param .u64 baton_scrub_headers_param_0,
	.param .u64 baton_scrub_headers_param_1,
	.param .u32 baton_scrub_headers_param_2,
	.param .u32 baton_scrub_headers_param_3
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<11>;
	.reg .b64 	%rd<26>;

	ld.param.u64 	%rd12, [baton_scrub_headers_param_0];
	ld.param.u64 	%rd13, [baton_scrub_headers_param_1];
	ld.param.u32 	%r1, [baton_scrub_headers_param_2];
	ld.param.u32 	%r2, [baton_scrub_headers_param_3];
	cvt.u64.u32 	%rd1, %r1;
	mul.wide.u32 	%rd2, %r2, %r1;
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd3, %r4;
	mul.wide.u32 	%rd14, %r3, %r4;
	mov.u32 	%r5, %tid.x;
	cvt.u64.u32 	%rd15, %r5;
	add.s64 	%rd24, %rd14, %rd15;
	setp.ge.u64 	%p1, %rd24, %rd2;
	@%p1 bra 	$L__BB0_6;

	mov.u32 	%r6, %nctaid.x;
	cvt.u64.u32 	%rd16, %r6;
	mul.lo.s64 	%rd5, %rd16, %rd3;
	cvta.to.global.u64 	%rd6, %rd12;
	cvt.u32.u64 	%r7, %rd1;

$L__BB0_2:
	and.b64  	%rd17, %rd24, -4294967296;
	setp.eq.s64 	%p2, %rd17, 0;
	@%p2 bra 	$L__BB0_4;

	div.u64 	%rd25, %rd24, %rd1;
	bra.uni 	$L__BB0_5;

$L__BB0_4:
	cvt.u32.u64 	%r8, %rd24;
	div.u32 	%r9, %r8, %r7;
	cvt.u64.u32 	%rd25, %r9;

$L__BB0_5:
	mul.lo.s64 	%rd18, %rd25, %rd1;
	sub.s64 	%rd19, %rd24, %rd18;
	mul.lo.s64 	%rd20, %rd25, %rd13;
	add.s64 	%rd21, %rd6, %rd20;
	shl.b64 	%rd22, %rd19, 2;
	add.s64 	%rd23, %rd21, %rd22;
	mov.u32 	%r10, 0;
	st.global.u32 	[%rd23], %r10;
	add.s64 	%rd24, %rd24, %rd5;
	setp.lt.u64 	%p3, %rd24, %rd2;
	@%p3 bra 	$L__BB0_2;

$L__BB0_6:
	ret;

}
	// .globl	baton_spin
.visible .entry baton_spin(
	.param .u64 baton_spin_param_0,
	.param .u64 baton_spin_param_1,
	.param .u32 baton_spin_param_2,
	.param .u64 baton_spin_param_3
)
{
	.reg .pred 	%p<12>;
	.reg .b32 	%r<22>;
	.reg .b64 	%rd<18>;

	ld.param.u64 	%rd9, [baton_spin_param_0];
	ld.param.u64 	%rd10, [baton_spin_param_1];
	ld.param.u32 	%r9, [baton_spin_param_2];
	ld.param.u64 	%rd8, [baton_spin_param_3];
	cvta.to.global.u64 	%rd1, %rd10;
	cvta.to.global.u64 	%rd2, %rd9;
	mov.u32 	%r10, %tid.x;
	mov.u32 	%r11, %ctaid.x;
	or.b32  	%r12, %r10, %r11;
	setp.ne.s32 	%p1, %r12, 0;
	setp.eq.s64 	%p2, %rd8, 0;
	or.pred  	%p3, %p1, %p2;
	@%p3 bra 	$L__BB1_13;

	setp.eq.s32 	%p4, %r9, 0;
	@%p4 bra 	$L__BB1_11;

	add.s32 	%r1, %r9, -1;
	and.b32  	%r2, %r9, 3;
	sub.s32 	%r3, %r9, %r2;
	mov.u64 	%rd16, 1;

$L__BB1_3:
	setp.lt.u32 	%p5, %r1, 3;
	mov.u32 	%r21, 0;
	@%p5 bra 	$L__BB1_6;

	mov.u32 	%r21, 0;
	mov.u32 	%r20, %r3;

$L__BB1_5:
	mul.wide.u32 	%rd12, %r21, 4;
	add.s64 	%rd13, %rd1, %rd12;
	mov.u32 	%r15, 195936478;
	st.volatile.global.u32 	[%rd13], %r15;
	st.volatile.global.u32 	[%rd13+4], %r15;
	st.volatile.global.u32 	[%rd13+8], %r15;
	st.volatile.global.u32 	[%rd13+12], %r15;
	add.s32 	%r21, %r21, 4;
	add.s32 	%r20, %r20, -4;
	setp.ne.s32 	%p6, %r20, 0;
	@%p6 bra 	$L__BB1_5;

$L__BB1_6:
	setp.eq.s32 	%p7, %r2, 0;
	@%p7 bra 	$L__BB1_10;

	setp.eq.s32 	%p8, %r2, 1;
	mul.wide.u32 	%rd14, %r21, 4;
	add.s64 	%rd4, %rd1, %rd14;
	mov.u32 	%r16, 195936478;
	st.volatile.global.u32 	[%rd4], %r16;
	@%p8 bra 	$L__BB1_10;

	setp.eq.s32 	%p9, %r2, 2;
	st.volatile.global.u32 	[%rd4+4], %r16;
	@%p9 bra 	$L__BB1_10;

	mov.u32 	%r18, 195936478;
	st.volatile.global.u32 	[%rd4+8], %r18;

$L__BB1_10:
	st.volatile.global.u64 	[%rd2], %rd16;
	membar.sys;
	add.s64 	%rd16, %rd16, 1;
	setp.gt.u64 	%p10, %rd16, %rd8;
	@%p10 bra 	$L__BB1_13;
	bra.uni 	$L__BB1_3;

$L__BB1_11:
	mov.u64 	%rd17, 1;

$L__BB1_12:
	st.volatile.global.u64 	[%rd2], %rd17;
	membar.sys;
	add.s64 	%rd17, %rd17, 1;
	setp.le.u64 	%p11, %rd17, %rd8;
	@%p11 bra 	$L__BB1_12;

$L__BB1_13:
	ret;

}
	// .globl	baton_fill_u32
.visible .entry baton_fill_u32(
	.param .u64 baton_fill_u32_param_0,
	.param .u64 baton_fill_u32_param_1,
	.param .u32 baton_fill_u32_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<9>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd7, [baton_fill_u32_param_0];
	ld.param.u64 	%rd8, [baton_fill_u32_param_1];
	ld.param.u32 	%r1, [baton_fill_u32_param_2];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	cvt.u64.u32 	%rd1, %r3;
	mul.wide.u32 	%rd9, %r2, %r3;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd10, %r4;
	add.s64 	%rd14, %rd9, %rd10;
	setp.ge.u64 	%p1, %rd14, %rd8;
	@%p1 bra 	$L__BB2_3;

	mov.u32 	%r5, %nctaid.x;
	cvt.u64.u32 	%rd11, %r5;
	mul.lo.s64 	%rd3, %rd11, %rd1;
	cvta.to.global.u64 	%rd4, %rd7;

$L__BB2_2:
	cvt.u32.u64 	%r6, %rd14;
	mul.lo.s32 	%r7, %r6, -1640531535;
	xor.b32  	%r8, %r7, %r1;
	shl.b64 	%rd12, %rd14, 2;
	add.s64 	%rd13, %rd4, %rd12;
	st.global.u32 	[%rd13], %r8;
	add.s64 	%rd14, %rd14, %rd3;
	setp.lt.u64 	%p2, %rd14, %rd8;
	@%p2 bra 	$L__BB2_2;

$L__BB2_3:
	ret;

}

)PTX";

}  // namespace baton
