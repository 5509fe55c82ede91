/* The NCCL external network plugin ABI (point-to-point "net" and collective "CollNet"),
 * versions 7, 8, 9 (CollNet), 10, 11 and 12, written for this project from NCCL's published plugin API.
 * Only what the reduction-server plugin needs; every layout is pinned by static asserts
 * (x86-64 / aarch64 LP64), so a wrong member order fails the build instead of a job.
 *
 * Version map (net and CollNet symbols NCCL searches, newest first; read from NCCL's loader,
 * src/net.cc up to 2.25, src/plugin/net.cc from 2.26):
 *   NCCL 2.19: v5-v7    2.20-2.23: v5-v8    2.24-2.25: v5-v9    2.26-2.27: v6-v10
 *   NCCL 2.28-2.29: v6-v11   2.30 (newest tag 2.30.7): v6-v12
 * docs/nccl-plugin.md has the whole table (file names tried, what the plugin does on each).
 */
#ifndef RS_NCCL_ABI_H_
#define RS_NCCL_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags of a log line (the ones this plugin uses). */
#define NCCL_INIT 1UL
#define NCCL_NET 16UL

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* phandle, int64_t pluginId,
                                               void* extData);

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_MAX_NET_SIZE_BYTES (1024LL * 1024 * 1024 * 1024) /* 1 TB: upper bound of maxCollBytes */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32 /* requests in flight per comm that NCCL may post */
#define NCCL_NET_ID_UNDEF (-1)

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t; /* identical in v7..v12 */

typedef ncclResult_t (*ncclGetVersion_t)(int* version); /* NCCL's public ncclGetVersion */

/* ---- device properties ------------------------------------------------------------------ */
/* Every version starts with the NIC's identity and has the same link members after its own
 * flags (v8 adds regIsGlobal, v11 forceFlush, then the virtual-device and size members). */
#define RS_NCCL_PROPS_IDENTITY \
  char* name;                  \
  char* pciPath;               \
  uint64_t guid;               \
  int ptrSupport;
#define RS_NCCL_PROPS_LINK         \
  int speed; /* Mbps */            \
  int port;                        \
  float latency;                   \
  int maxComms;                    \
  int maxRecvs;                    \
  ncclNetDeviceType netDeviceType; \
  int netDeviceVersion;

typedef struct {
  RS_NCCL_PROPS_IDENTITY
  RS_NCCL_PROPS_LINK
} ncclNetProperties_v7_t;

typedef struct {
  RS_NCCL_PROPS_IDENTITY
  int regIsGlobal;
  RS_NCCL_PROPS_LINK
} ncclNetProperties_v8_t;

typedef struct {
  int ndevs;
  int devs[4];
} ncclNetVDeviceProps_v11_t;

typedef struct {
  int ndevs;
  int devs[8];
} ncclNetVDeviceProps_v12_t;

/* v9 to v12 properties share everything up to maxCollBytes; v11 adds maxMultiRequestSize, v12 the
 * rail/plane ids and 8 virtual-device slots. v9 and v10 are the same layout (NCCL 2.24-2.27). */
#define RS_NCCL_PROPS_V9_ON(VPROPS) \
  RS_NCCL_PROPS_IDENTITY            \
  int regIsGlobal;                  \
  int forceFlush;                   \
  RS_NCCL_PROPS_LINK                \
  VPROPS vProps;                    \
  size_t maxP2pBytes;               \
  size_t maxCollBytes;

typedef ncclNetVDeviceProps_v11_t ncclNetVDeviceProps_v10_t; /* devs[4] in v9, v10 and v11 */

typedef struct {
  RS_NCCL_PROPS_V9_ON(ncclNetVDeviceProps_v10_t)
} ncclNetProperties_v10_t;
typedef ncclNetProperties_v10_t ncclNetProperties_v9_t;

typedef struct {
  RS_NCCL_PROPS_V9_ON(ncclNetVDeviceProps_v11_t)
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
  RS_NCCL_PROPS_V9_ON(ncclNetVDeviceProps_v12_t)
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

typedef struct {
  int trafficClass;
} ncclNetCommConfig_t; /* v10, v11 and v12 */

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_t;

typedef struct {
  ncclNetCommAttr_t sendCommAttr;
  ncclNetCommAttr_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_t; /* v11 and v12 */

typedef struct {
  void* mhandle;
  void* address;
  uint32_t size;
} ncclNetSGE_v8_t;

typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} ncclNetSGE_t; /* v9 to v12 */

/* ---- point-to-point net ------------------------------------------------------------------- */
/* The first members of v7 and v8 tables, net and CollNet alike. */
#define RS_NCCL_V7_V8_OPENING(PROPS)                    \
  const char* name;                                     \
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);  \
  ncclResult_t (*devices)(int* ndev);                   \
  ncclResult_t (*getProperties)(int dev, PROPS* props); \
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);

/* iflush to irecvConsumed: the same in every net version. */
#define RS_NCCL_NET_FROM_IFLUSH                                                                            \
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request); \
  ncclResult_t (*test)(void* request, int* done, int* sizes);                                              \
  ncclResult_t (*closeSend)(void* sendComm);                                                               \
  ncclResult_t (*closeRecv)(void* recvComm);                                                               \
  ncclResult_t (*closeListen)(void* listenComm);                                                           \
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);                             \
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);

/* v7 and v8 differ in the properties and in regMr's size (int in v7). */
#define RS_NCCL_NET_V7_V8(PROPS, REG_SIZE)                                                                             \
  RS_NCCL_V7_V8_OPENING(PROPS)                                                                                         \
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);                \
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);                      \
  ncclResult_t (*regMr)(void* comm, void* data, REG_SIZE size, int type, void** mhandle);                              \
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle); \
  ncclResult_t (*deregMr)(void* comm, void* mhandle);                                                                  \
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);                 \
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);   \
  RS_NCCL_NET_FROM_IFLUSH

typedef struct {
  RS_NCCL_NET_V7_V8(ncclNetProperties_v7_t, int)
} ncclNet_v7_t;

typedef struct {
  RS_NCCL_NET_V7_V8(ncclNetProperties_v8_t, size_t)
} ncclNet_v8_t;

/* v10 (NCCL 2.26-2.27): no context yet; init takes the profiler callback, connect a comm config,
 * isend / irecv carry profiler handles; makeVDevice is the last member. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  RS_NCCL_NET_FROM_IFLUSH
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

/* v11 and v12 differ only in the properties and virtual-device structs. */
#define RS_NCCL_NET_V11_V12(PROPS, VPROPS)                                                                             \
  const char* name;                                                                                                    \
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_t* config, ncclDebugLogger_t logFunction,        \
                       ncclProfilerCallback_t profFunction);                                                           \
  ncclResult_t (*devices)(int* ndev);                                                                                  \
  ncclResult_t (*getProperties)(int dev, PROPS* props);                                                                \
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);                                         \
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_t** sendDevComm);     \
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);                      \
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);                                \
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle); \
  ncclResult_t (*deregMr)(void* comm, void* mhandle);                                                                  \
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,                \
                        void** request);                                                                               \
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,                 \
                        void** phandles, void** request);                                                              \
  RS_NCCL_NET_FROM_IFLUSH                                                                                              \
  ncclResult_t (*makeVDevice)(int* d, VPROPS* props);                                                                  \
  ncclResult_t (*finalize)(void* ctx);                                                                                 \
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_t* netAttr);

typedef struct {
  RS_NCCL_NET_V11_V12(ncclNetProperties_v11_t, ncclNetVDeviceProps_v11_t)
} ncclNet_v11_t;

typedef struct {
  RS_NCCL_NET_V11_V12(ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t)
} ncclNet_v12_t;

/* ---- CollNet --------------------------------------------------------------------------------- */
/* v7 and v8 share all but the properties, regMr's size (int in v7) and v8's all-gather /
 * reduce-scatter members, which v7 does not have. */
#define RS_NCCL_COLLNET_V7_V8_HEAD(PROPS, REG_SIZE)                                                              \
  RS_NCCL_V7_V8_OPENING(PROPS)                                                                                   \
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);             \
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);                     \
  ncclResult_t (*regMr)(void* collComm, void* data, REG_SIZE size, int type, void** mhandle);                    \
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,        \
                              void** mhandle);                                                                   \
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);                                                        \
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, int count, ncclDataType_t dataType, \
                             ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle, void** request);
#define RS_NCCL_COLLNET_V7_V8_TAIL                                                             \
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request); \
  ncclResult_t (*test)(void* request, int* done, int* size);                                   \
  ncclResult_t (*closeColl)(void* collComm);                                                   \
  ncclResult_t (*closeListen)(void* listenComm);

typedef struct {
  RS_NCCL_COLLNET_V7_V8_HEAD(ncclNetProperties_v7_t, int)
  RS_NCCL_COLLNET_V7_V8_TAIL
} ncclCollNet_v7_t;

typedef struct {
  RS_NCCL_COLLNET_V7_V8_HEAD(ncclNetProperties_v8_t, size_t)
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, ncclNetSGE_v8_t* recvParts,
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void* sendMhandle,
                             void** request);
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, ncclNetSGE_v8_t* sendParts, void* recvData,
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes, ncclDataType_t dataType,
                                 ncclRedOp_t redOp, void* recvMhandle, void** request);
  RS_NCCL_COLLNET_V7_V8_TAIL
} ncclCollNet_v8_t;

/* connect to closeListen: the same in v9 to v12 (size_t counts and SGE sizes). */
#define RS_NCCL_COLLNET_FROM_CONNECT                                                                                \
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);                \
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);                        \
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);                         \
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,           \
                              void** mhandle);                                                                      \
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);                                                           \
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count, ncclDataType_t dataType, \
                             ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle, void** request);              \
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, ncclNetSGE_t* recvParts,               \
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void* sendMhandle,       \
                             void** request);                                                                       \
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, ncclNetSGE_t* sendParts, void* recvData,           \
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes,                      \
                                 ncclDataType_t dataType, ncclRedOp_t redOp, void* recvMhandle, void** request);    \
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);                      \
  ncclResult_t (*test)(void* request, int* done, int* size);                                                        \
  ncclResult_t (*closeColl)(void* collComm);                                                                        \
  ncclResult_t (*closeListen)(void* listenComm);

/* v9 (NCCL 2.24-2.25) and v10 (2.26-2.27): no context, no finalize; the same layout. */
typedef struct {
  RS_NCCL_V7_V8_OPENING(ncclNetProperties_v10_t)
  RS_NCCL_COLLNET_FROM_CONNECT
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclCollNet_v10_t;
typedef ncclCollNet_v10_t ncclCollNet_v9_t;

#define RS_NCCL_COLLNET_V11_V12(PROPS, VPROPS)                                      \
  const char* name;                                                                 \
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction); \
  ncclResult_t (*devices)(int* ndev);                                               \
  ncclResult_t (*getProperties)(int dev, PROPS* props);                             \
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);      \
  RS_NCCL_COLLNET_FROM_CONNECT                                                      \
  ncclResult_t (*makeVDevice)(int* d, VPROPS* props);                               \
  ncclResult_t (*finalize)(void* ctx);

typedef struct {
  RS_NCCL_COLLNET_V11_V12(ncclNetProperties_v11_t, ncclNetVDeviceProps_v11_t)
} ncclCollNet_v11_t;

typedef struct {
  RS_NCCL_COLLNET_V11_V12(ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t)
} ncclCollNet_v12_t;

#ifdef __cplusplus
} /* extern "C" */

#include <cstddef>
#define RS_PTR(n) (8 * (n))
static_assert(sizeof(void*) == 8, "the NCCL plugin ABI is written for LP64 targets");
static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclNetDeviceType) == 4, "enums are ints");
static_assert(sizeof(ncclNetDeviceHandle_t) == 32, "device handle");
static_assert(offsetof(ncclNetDeviceHandle_t, size) == 16, "device handle");
static_assert(sizeof(ncclNetProperties_v7_t) == 56, "v7 properties");
static_assert(offsetof(ncclNetProperties_v7_t, speed) == 28, "v7 properties");
static_assert(offsetof(ncclNetProperties_v7_t, netDeviceVersion) == 52, "v7 properties");
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties");
static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24, "v8 properties");
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "v8 properties");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 properties");
static_assert(sizeof(ncclNetProperties_v10_t) == 104, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, forceFlush) == 32, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, speed) == 36, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, netDeviceVersion) == 60, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, vProps) == 64, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, maxP2pBytes) == 88, "v9/v10 properties");
static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96, "v9/v10 properties");
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties");
static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36, "v11 properties");
static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64, "v11 properties");
static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88, "v11 properties");
static_assert(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96, "v11 properties");
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 properties");
static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 properties");
static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "v12 properties");
static_assert(sizeof(ncclNetAttr_t) == 44, "net attributes");
static_assert(sizeof(ncclNetSGE_v8_t) == 24 && offsetof(ncclNetSGE_v8_t, size) == 16, "v8 SGE");
static_assert(sizeof(ncclNetSGE_t) == 24 && offsetof(ncclNetSGE_t, size) == 16, "SGE");
static_assert(sizeof(ncclNet_v7_t) == RS_PTR(19), "v7 net table");
static_assert(offsetof(ncclNet_v7_t, regMr) == RS_PTR(7) && offsetof(ncclNet_v7_t, test) == RS_PTR(13), "v7 net table");
static_assert(sizeof(ncclNet_v8_t) == RS_PTR(19), "v8 net table");
static_assert(offsetof(ncclNet_v8_t, isend) == RS_PTR(10), "v8 net table");
static_assert(offsetof(ncclNet_v8_t, test) == RS_PTR(13), "v8 net table");
static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == RS_PTR(18), "v8 net table");
static_assert(sizeof(ncclNet_v10_t) == RS_PTR(20), "v10 net table");
static_assert(offsetof(ncclNet_v10_t, connect) == RS_PTR(5) && offsetof(ncclNet_v10_t, isend) == RS_PTR(10),
              "v10 net table");
static_assert(offsetof(ncclNet_v10_t, test) == RS_PTR(13), "v10 net table");
static_assert(offsetof(ncclNet_v10_t, irecvConsumed) == RS_PTR(18), "v10 net table");
static_assert(offsetof(ncclNet_v10_t, makeVDevice) == RS_PTR(19), "v10 net table");
static_assert(sizeof(ncclNet_v11_t) == RS_PTR(22) && sizeof(ncclNet_v12_t) == RS_PTR(22), "v11/v12 net table");
static_assert(offsetof(ncclNet_v12_t, test) == RS_PTR(13), "v12 net table");
static_assert(offsetof(ncclNet_v12_t, makeVDevice) == RS_PTR(19), "v12 net table");
static_assert(offsetof(ncclNet_v12_t, finalize) == RS_PTR(20), "v12 net table");
static_assert(sizeof(ncclCollNet_v7_t) == RS_PTR(15), "v7 collnet table");
static_assert(offsetof(ncclCollNet_v7_t, iallreduce) == RS_PTR(10), "v7 collnet table");
static_assert(offsetof(ncclCollNet_v7_t, iflush) == RS_PTR(11), "v7 collnet table");
static_assert(offsetof(ncclCollNet_v7_t, closeListen) == RS_PTR(14), "v7 collnet table");
static_assert(sizeof(ncclCollNet_v8_t) == RS_PTR(17), "v8 collnet table");
static_assert(offsetof(ncclCollNet_v8_t, iallreduce) == RS_PTR(10), "v8 collnet table");
static_assert(offsetof(ncclCollNet_v8_t, test) == RS_PTR(14), "v8 collnet table");
static_assert(sizeof(ncclCollNet_v10_t) == RS_PTR(18), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, connect) == RS_PTR(5), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, iallreduce) == RS_PTR(10), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, iallgather) == RS_PTR(11), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, ireducescatter) == RS_PTR(12), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, test) == RS_PTR(14), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, closeListen) == RS_PTR(16), "v9/v10 collnet table");
static_assert(offsetof(ncclCollNet_v10_t, makeVDevice) == RS_PTR(17), "v9/v10 collnet table");
static_assert(sizeof(ncclCollNet_v11_t) == RS_PTR(19) && sizeof(ncclCollNet_v12_t) == RS_PTR(19), "collnet table");
static_assert(offsetof(ncclCollNet_v12_t, iallreduce) == RS_PTR(10), "v12 collnet table");
static_assert(offsetof(ncclCollNet_v12_t, test) == RS_PTR(14), "v12 collnet table");
static_assert(offsetof(ncclCollNet_v12_t, finalize) == RS_PTR(18), "v12 collnet table");
#undef RS_PTR
#endif /* __cplusplus */

#endif /* RS_NCCL_ABI_H_ */
