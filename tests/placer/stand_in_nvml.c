/* A stand-in for NVIDIA's libnvidia-ml.so.1, built by the tests (tests/placer/nvml_stand_in.py)
 * so that pynvml, unchanged, loads it through its own loader (LD_LIBRARY_PATH) on a machine
 * without a GPU. It implements exactly the NVML calls `policyc.placer.nvml` makes, with
 * NVML's C signatures and struct layouts, and answers from a device table: the text file
 * named by POLICYC_STAND_IN_NVML, re-read on every call so a test can script a GPU going
 * bad between two refresher ticks.
 *
 * The table: '#' starts a comment; `init=N` makes nvmlInit return NVML error N; every other
 * line is one GPU, its fields separated by '|':
 *
 *   name|PCI bus id|SM util %|memory util %|memory total B|memory free B|SM clock MHz|
 *   max SM clock MHz|PCIe TX KB/s|PCIe RX KB/s|link generation|link width|uncorrected ECC|
 *   failing calls ("-", or "nvmlDeviceGetName:15,nvmlDeviceGetPcieThroughput:3": call:error)
 *
 * and `proc=GPU index|pid|SM util %|memory util %` is one process using a GPU: what
 * nvmlDeviceGetProcessUtilization reports for it, one sample stamped at the call's time;
 * `cuda=N` is the CUDA version the driver supports, as nvmlSystemGetCudaDriverVersion gives
 * it (12040: 12.4; without the line the call answers Not Supported).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define MAX_GPUS 64
#define NOT_SUPPORTED 3
#define INVALID_ARGUMENT 2
#define UNINITIALIZED 1
#define GPU_NOT_FOUND 28
#define NOT_FOUND 6
#define INSUFFICIENT_SIZE 7
#define MAX_PROCS 256

typedef struct {
    char name[96], bus_id[32], failing[512];
    unsigned sm_util, mem_util, sm_clock, max_sm_clock, tx, rx, gen, width;
    unsigned long long mem_total, mem_free, ecc;
} gpu_t;

typedef struct { unsigned gpu, memory; } utilization_t;
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_sub_system_id;
    char bus_id[32];
} pci_info_t;

typedef struct { unsigned gpu, pid, sm_util, mem_util; } proc_t;
typedef struct {
    unsigned pid;
    unsigned long long time_stamp;
    unsigned sm_util, mem_util, enc_util, dec_util;
} process_sample_t;

static gpu_t gpus[MAX_GPUS];
static proc_t procs[MAX_PROCS];
static int n_gpus, n_procs, init_error, initialised, cuda_version;

static void load(void) {
    const char *path = getenv("POLICYC_STAND_IN_NVML");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[2048];
    n_gpus = 0;
    n_procs = 0;
    init_error = 0;
    cuda_version = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f) && n_gpus < MAX_GPUS) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        if (strncmp(line, "init=", 5) == 0) { init_error = atoi(line + 5); continue; }
        if (strncmp(line, "cuda=", 5) == 0) { cuda_version = atoi(line + 5); continue; }
        if (strncmp(line, "proc=", 5) == 0) {
            proc_t *q = &procs[n_procs];
            if (n_procs < MAX_PROCS && sscanf(line + 5, "%u|%u|%u|%u", &q->gpu, &q->pid, &q->sm_util, &q->mem_util) == 4)
                n_procs++;
            continue;
        }
        gpu_t *g = &gpus[n_gpus];
        char *field[14];
        int n = 0;
        for (char *p = line, *bar; n < 14; p = bar + 1) {
            field[n++] = p;
            if (!(bar = strchr(p, '|'))) break;
            *bar = 0;
        }
        if (n != 14) continue; /* a malformed line is no GPU */
        snprintf(g->name, sizeof g->name, "%s", field[0]);
        snprintf(g->bus_id, sizeof g->bus_id, "%s", field[1]);
        g->sm_util = strtoul(field[2], 0, 10);
        g->mem_util = strtoul(field[3], 0, 10);
        g->mem_total = strtoull(field[4], 0, 10);
        g->mem_free = strtoull(field[5], 0, 10);
        g->sm_clock = strtoul(field[6], 0, 10);
        g->max_sm_clock = strtoul(field[7], 0, 10);
        g->tx = strtoul(field[8], 0, 10);
        g->rx = strtoul(field[9], 0, 10);
        g->gen = strtoul(field[10], 0, 10);
        g->width = strtoul(field[11], 0, 10);
        g->ecc = strtoull(field[12], 0, 10);
        snprintf(g->failing, sizeof g->failing, ",%s,", field[13]);
        n_gpus++;
    }
    fclose(f);
}

/* The GPU behind a handle (index + 1), with the table re-read; or the error `call` returns. */
static int gpu_for(const void *handle, const char *call, gpu_t **out) {
    if (!initialised) return UNINITIALIZED;
    load();
    long i = (long)handle - 1;
    if (i < 0 || i >= n_gpus) return INVALID_ARGUMENT;
    *out = &gpus[i];
    char key[128];
    snprintf(key, sizeof key, ",%s:", call);
    const char *hit = strstr((*out)->failing, key);
    return hit ? atoi(hit + strlen(key)) : 0;
}

int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    load();
    if (init_error) return init_error;
    initialised = 1;
    return 0;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) {
    if (!initialised) return UNINITIALIZED;
    initialised = 0;
    return 0;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case 0: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    case GPU_NOT_FOUND: return "GPU not found";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return UNINITIALIZED;
    load();
    if (!cuda_version) return NOT_SUPPORTED;
    *version = cuda_version;
    return 0;
}
int nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

int nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialised) return UNINITIALIZED;
    load();
    *count = (unsigned)n_gpus;
    return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) {
    if (!initialised) return UNINITIALIZED;
    load();
    if (index >= (unsigned)n_gpus) return INVALID_ARGUMENT;
    *handle = (void *)(long)(index + 1);
    return 0;
}

int nvmlDeviceGetName(void *h, char *name, unsigned length) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetName", &g);
    if (!e) snprintf(name, length, "%s", g->name);
    return e;
}

int nvmlDeviceGetUtilizationRates(void *h, utilization_t *u) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetUtilizationRates", &g);
    if (!e) u->gpu = g->sm_util, u->memory = g->mem_util;
    return e;
}

int nvmlDeviceGetMemoryInfo(void *h, memory_t *m) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetMemoryInfo", &g);
    if (!e) m->total = g->mem_total, m->free = g->mem_free, m->used = g->mem_total - g->mem_free;
    return e;
}

int nvmlDeviceGetPciInfo_v3(void *h, pci_info_t *p) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetPciInfo", &g);
    if (e) return e;
    memset(p, 0, sizeof *p);
    snprintf(p->bus_id, sizeof p->bus_id, "%s", g->bus_id);
    snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "%s", g->bus_id + 4);
    sscanf(g->bus_id, "%x:%x:%x", &p->domain, &p->bus, &p->device);
    return 0;
}

int nvmlDeviceGetClockInfo(void *h, int type, unsigned *clock) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetClockInfo", &g);
    if (!e) *clock = type == 1 ? g->sm_clock : 0; /* NVML_CLOCK_SM = 1 */
    return e;
}

int nvmlDeviceGetMaxClockInfo(void *h, int type, unsigned *clock) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetMaxClockInfo", &g);
    if (!e) *clock = type == 1 ? g->max_sm_clock : 0;
    return e;
}

int nvmlDeviceGetPcieThroughput(void *h, int counter, unsigned *value) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetPcieThroughput", &g);
    if (!e) *value = counter == 0 ? g->tx : g->rx; /* NVML_PCIE_UTIL_TX_BYTES = 0 */
    return e;
}

int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *gen) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetCurrPcieLinkGeneration", &g);
    if (!e) *gen = g->gen;
    return e;
}

int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *width) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetCurrPcieLinkWidth", &g);
    if (!e) *width = g->width;
    return e;
}

int nvmlDeviceGetTotalEccErrors(void *h, int error_type, int counter_type, unsigned long long *count) {
    gpu_t *g;
    (void)counter_type;
    int e = gpu_for(h, "nvmlDeviceGetTotalEccErrors", &g);
    if (!e) *count = error_type == 1 ? g->ecc : 0; /* NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 */
    return e;
}

/* The processes the table puts on this GPU, one sample each, stamped now (microseconds). */
int nvmlDeviceGetProcessUtilization(void *h, process_sample_t *samples, unsigned *count, unsigned long long last_seen) {
    gpu_t *g;
    int e = gpu_for(h, "nvmlDeviceGetProcessUtilization", &g);
    if (e) return e;
    if (!count) return INVALID_ARGUMENT;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long now = (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    unsigned gpu = (unsigned)((long)h - 1), n = 0;
    for (int i = 0; i < n_procs; i++) n += procs[i].gpu == gpu;
    if (n == 0 || now <= last_seen) return NOT_FOUND;
    if (!samples || *count < n) { *count = n; return INSUFFICIENT_SIZE; }
    unsigned k = 0;
    for (int i = 0; i < n_procs; i++) {
        if (procs[i].gpu != gpu) continue;
        samples[k].pid = procs[i].pid;
        samples[k].time_stamp = now;
        samples[k].sm_util = procs[i].sm_util;
        samples[k].mem_util = procs[i].mem_util;
        samples[k].enc_util = samples[k].dec_util = 0;
        k++;
    }
    *count = k;
    return 0;
}
