/* baton_torch_alloc.h: PyTorch's pluggable CUDA allocator over Baton's device KV pool.
 *
 * libbaton_torch_alloc.so exports the two functions torch.cuda.memory.CUDAPluggableAllocator
 * calls, carving block-aligned allocations out of the device pool blocks the engine holds
 * (standby/sdk/block_allocator.h), so that the KV cache a framework allocates inside
 * `use_mem_pool(MemPool(allocator))` lives in the memory Baton lends and fences:
 *
 *   baton_torch_alloc_attach(engine)  after baton_engine_connect_flags(...,
 *                                     BATON_ENGINE_USE_DEVICE_MEMORY) and the promotion
 *   baton_torch_alloc_refresh()       after every grant or return of blocks
 *   baton_torch_malloc / baton_torch_free   PyTorch's signatures (ssize_t size, int device,
 *                                     cudaStream_t stream) and (void*, ssize_t, int, stream)
 *
 * Allocations are whole blocks, first fit; malloc returns NULL (PyTorch raises its out of
 * memory error) when no run of held free blocks is large enough, or on another device.
 * free returns the blocks at once: the caller synchronizes the stream first, as for any
 * allocation a framework frees while kernels may still use it. One engine per process;
 * every function is thread-safe. Functions returning int follow baton_engine.h (0 success,
 * a StatusCode value otherwise; baton_torch_alloc_last_error() names it).
 */
#ifndef BATON_STANDBY_BATON_TORCH_ALLOC_H_
#define BATON_STANDBY_BATON_TORCH_ALLOC_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "standby/sdk/baton_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

BATON_ENGINE_API int baton_torch_alloc_attach(baton_engine* engine);
BATON_ENGINE_API int baton_torch_alloc_refresh(void);
BATON_ENGINE_API void* baton_torch_malloc(ssize_t size, int device, void* stream);
BATON_ENGINE_API void baton_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* Bytes of held blocks not allocated; 0 when not attached. */
BATON_ENGINE_API uint64_t baton_torch_alloc_free_bytes(void);
BATON_ENGINE_API const char* baton_torch_alloc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* BATON_STANDBY_BATON_TORCH_ALLOC_H_ */
