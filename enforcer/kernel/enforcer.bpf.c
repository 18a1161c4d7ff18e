// policyc enforcer: the kernel plane, one bcc module holding every program and map.
//
// Observe   tc_ingress / tc_egress: per-flow and per-backend counters (keyed by hook, since on
//           loopback every packet passes both), and an HTTP/2 frame walker (egress only) that
//           times each stream from its first HEADERS to END_STREAM in both directions or
//           RST_STREAM. Streams slower than the active budget are flagged.
// Quarantine on_connect4 / on_connect6: a connect() aimed at a quarantined backend becomes a
//           connect() to its backup; entries carry their own expiry so that a dead guardian
//           cannot leave a backend quarantined for ever. Optionally tc drops what still flows.
// Audit     every kernel-side action and every map change is written to the `events` ring
//           buffer. Map changes go through `ctl`, a program user space runs with
//           BPF_PROG_TEST_RUN, so that a change and its audit record cannot part.
//
// Compiled with bcc against stable public types only (see shared/ENVIRONMENT.md).
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/pkt_cls.h>

#define HOOK_INGRESS 0
#define HOOK_EGRESS 1

#define EV_STREAM_DONE 1
#define EV_CONNECT_REDIRECT 2
#define EV_TC_DROP 3
#define EV_MAP_CHANGE 4
#define EV_H2_DESYNC 5

#define OP_QUARANTINE_SET 1
#define OP_QUARANTINE_DEL 2
#define OP_BACKEND_SET 3
#define OP_BACKEND_DEL 4
#define OP_RULE_SET 5
#define OP_RULE_DEL 6
#define OP_CONFIG_SET 7

#define CFG_TC_DROP_QUARANTINED 0
#define CFG_STREAM_BUDGET_NS 1
#define CFG_SLOTS 8

#define STREAM_F_RST 1
#define STREAM_F_OVER_BUDGET 2

// What the TC observers answer for a packet they let through: "no verdict", so that the
// next filter on the interface runs too (TC_ACT_OK would end the chain there: a second
// policyc process observing the same interface, at the same priority, would see nothing).
// With no filter left to decide, the packet passes.
#define TC_PASS TC_ACT_UNSPEC

#define H2_MAX_FRAMES_PER_SEGMENT 32
#define H2_PREFACE_LEN 24

struct endpoint {
    u32 addr[4];   // IPv6 or IPv4-mapped, network byte order words
    u16 port;      // host byte order
    u16 pad;
};

struct flow_key {
    struct endpoint src;
    struct endpoint dst;
    u8 proto;
    u8 hook;
    u16 pad;
};

struct counters {
    u64 packets;
    u64 bytes;    // skb->len: what the hook saw, headers included
    u64 payload;  // transport payload bytes
};

struct backend_key {
    u32 id;
    u8 hook;
    u8 toward;   // 1: packet travels to the backend, 0: from it
    u16 pad;
};

struct quarantine_val {
    struct endpoint backup;
    u32 rule;
    u32 pad;
    u64 until_ns;   // bpf_ktime_get_ns (CLOCK_MONOTONIC); 0: no expiry
};

struct dir_key {
    struct endpoint src;
    struct endpoint dst;
};

struct h2_dir {
    u32 next_seq;   // TCP sequence number where the next frame header starts
    u8 active;
    u8 is_client;
    u16 pad;
};

struct stream_key {
    struct endpoint client;
    struct endpoint server;
    u32 stream_id;
    u32 pad;
};

struct stream_val {
    u64 start_ns;
    u8 ended_client;
    u8 ended_server;
    u16 pad;
    u32 pad2;
};

struct event {
    u64 ts_ns;
    u32 kind;
    u32 op;
    u32 rule;
    u32 stream_id;
    u32 flags;
    s32 result;
    struct endpoint a;
    struct endpoint b;
    u64 value;
    u64 value2;
};

struct ctl_cmd {
    u32 op;
    u32 rule;
    struct endpoint key;
    struct endpoint val;
    u64 arg;
    u64 arg2;
};

BPF_HASH(flows, struct flow_key, struct counters, 65536);
BPF_HASH(backends, struct endpoint, u32, 4096);
BPF_HASH(backend_stats, struct backend_key, struct counters, 16384);
BPF_HASH(quarantine, struct endpoint, struct quarantine_val, 4096);
// socket cookie -> the quarantined endpoint its connect was rewritten away from: once the
// quarantine is released, user space ends exactly these connections (the gateway then
// connects to the model server again); least recently used first out
BPF_TABLE("lru_hash", u64, struct endpoint, redirected, 16384);
BPF_HASH(rules, u32, u64, 1024);   // rule index -> budget (ns) compiled from the bundle
BPF_ARRAY(config, u64, CFG_SLOTS);
BPF_HASH(h2_dirs, struct dir_key, struct h2_dir, 16384);
BPF_HASH(h2_streams, struct stream_key, struct stream_val, 65536);
BPF_RINGBUF_OUTPUT(events, 256);

static __always_inline u64 cfg(u32 slot) {
    u64 *v = config.lookup(&slot);
    return v ? *v : 0;
}

static __always_inline void emit(struct event *e) {
    e->ts_ns = bpf_ktime_get_ns();
    events.ringbuf_output(e, sizeof(*e), 0);
}

// A stream's end: one or more per call through the gateway, wanted by windows of 10 ms and
// more (backend health, cross-layer signals), never at once. Written without waking the
// reader, which collects them every few milliseconds (`KernelPlane._poll`): a wakeup per
// stream cost the serving process a thread switch and the interpreter lock per call.
static __always_inline void emit_quiet(struct event *e) {
    e->ts_ns = bpf_ktime_get_ns();
    events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP);
}

static __always_inline void mapped_v4(struct endpoint *ep, u32 ip4_be, u16 port) {
    ep->addr[0] = 0;
    ep->addr[1] = 0;
    ep->addr[2] = bpf_htonl(0x0000ffff);
    ep->addr[3] = ip4_be;
    ep->port = port;
    ep->pad = 0;
}

static __always_inline int is_mapped_v4(struct endpoint *ep) {
    return ep->addr[0] == 0 && ep->addr[1] == 0 && ep->addr[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void add(struct counters *c, u64 bytes, u64 payload) {
    __sync_fetch_and_add(&c->packets, 1);
    __sync_fetch_and_add(&c->bytes, bytes);
    __sync_fetch_and_add(&c->payload, payload);
}

static __always_inline void count_flow(struct flow_key *k, u64 bytes, u64 payload) {
    struct counters zero = {};
    struct counters *c = flows.lookup_or_try_init(k, &zero);
    if (c)
        add(c, bytes, payload);
}

static __always_inline void count_backend(struct endpoint *ep, u8 hook, u8 toward, u64 bytes, u64 payload) {
    u32 *id = backends.lookup(ep);
    if (!id)
        return;
    struct backend_key bk = {};
    bk.id = *id;
    bk.hook = hook;
    bk.toward = toward;
    struct counters zero = {};
    struct counters *c = backend_stats.lookup_or_try_init(&bk, &zero);
    if (c)
        add(c, bytes, payload);
}

static __always_inline void stream_frame(struct dir_key *dk, u8 is_client, u32 sid, u8 type, u8 flags) {
    if (sid == 0)
        return;
    struct stream_key sk = {};
    if (is_client) {
        sk.client = dk->src;
        sk.server = dk->dst;
    } else {
        sk.client = dk->dst;
        sk.server = dk->src;
    }
    sk.stream_id = sid;
    struct stream_val *sv = h2_streams.lookup(&sk);
    u64 now = bpf_ktime_get_ns();
    if (!sv) {
        if (type != 1)   // a stream starts with HEADERS; anything else is a late frame
            return;
        struct stream_val fresh = {};
        fresh.start_ns = now;
        h2_streams.update(&sk, &fresh);
        sv = h2_streams.lookup(&sk);
        if (!sv)
            return;
    }
    u32 done_flags = 0;
    if (type == 3) {
        done_flags = STREAM_F_RST;
    } else if ((type == 0 || type == 1) && (flags & 0x1)) {
        if (is_client)
            sv->ended_client = 1;
        else
            sv->ended_server = 1;
        if (!(sv->ended_client && sv->ended_server))
            return;
    } else {
        return;
    }
    struct event e = {};
    e.kind = EV_STREAM_DONE;
    e.stream_id = sid;
    e.a = sk.client;
    e.b = sk.server;
    e.value = now - sv->start_ns;
    e.value2 = sv->start_ns;
    u64 budget = cfg(CFG_STREAM_BUDGET_NS);
    if (budget && e.value > budget)
        done_flags |= STREAM_F_OVER_BUDGET;
    e.flags = done_flags;
    emit_quiet(&e);
    h2_streams.delete(&sk);
}

static __always_inline void walk_h2(struct __sk_buff *skb, struct dir_key *dk, struct tcphdr *th,
                                    u32 payload_off, u32 payload_len) {
    u8 syn = th->syn, ack = th->ack;
    u32 seq = bpf_ntohl(th->seq);
    if (syn) {
        // The client opens with the 24-byte preface, the server with its SETTINGS frame.
        struct h2_dir d = {};
        d.is_client = !ack;
        d.next_seq = seq + 1 + (d.is_client ? H2_PREFACE_LEN : 0);
        d.active = 1;
        h2_dirs.update(dk, &d);
        return;
    }
    if (th->fin || th->rst) {
        h2_dirs.delete(dk);
        return;
    }
    if (payload_len == 0)
        return;
    struct h2_dir *d = h2_dirs.lookup(dk);
    if (!d || !d->active)
        return;
    u32 end = seq + payload_len;
    u32 next = d->next_seq;
    if ((s32)(next - seq) < 0) {
        // Bytes before the next frame header were never seen: the walk has lost its place.
        d->active = 0;
        struct event e = {};
        e.kind = EV_H2_DESYNC;
        e.a = dk->src;
        e.b = dk->dst;
        e.value = next;
        e.value2 = seq;
        emit(&e);
        return;
    }
    u8 is_client = d->is_client;
    for (int i = 0; i < H2_MAX_FRAMES_PER_SEGMENT; i++) {
        if ((s32)(next - end) >= 0)
            break;
        if ((s32)(next + 9 - end) > 0) {
            // A frame header split across segments; rare on loopback, reported when it happens.
            d->active = 0;
            struct event e = {};
            e.kind = EV_H2_DESYNC;
            e.a = dk->src;
            e.b = dk->dst;
            e.value = next;
            e.value2 = end;
            emit(&e);
            return;
        }
        u32 off = payload_off + (next - seq);
        u8 hdr[9] = {};
        if (bpf_skb_load_bytes(skb, off, hdr, 9) < 0)
            break;
        u32 len = ((u32)hdr[0] << 16) | ((u32)hdr[1] << 8) | hdr[2];
        u32 sid = (((u32)hdr[5] & 0x7f) << 24) | ((u32)hdr[6] << 16) | ((u32)hdr[7] << 8) | hdr[8];
        stream_frame(dk, is_client, sid, hdr[3], hdr[4]);
        next += 9 + len;
    }
    d->next_seq = next;
}

static __always_inline int observe(struct __sk_buff *skb, u8 hook) {
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return TC_PASS;
    struct flow_key k = {};
    k.hook = hook;
    u32 l4_off;
    u16 proto = eth->h_proto;
    if (proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > data_end)
            return TC_PASS;
        mapped_v4(&k.src, ip->saddr, 0);
        mapped_v4(&k.dst, ip->daddr, 0);
        k.proto = ip->protocol;
        l4_off = sizeof(*eth) + ip->ihl * 4;
    } else if (proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > data_end)
            return TC_PASS;
        __builtin_memcpy(k.src.addr, &ip6->saddr, 16);
        __builtin_memcpy(k.dst.addr, &ip6->daddr, 16);
        k.proto = ip6->nexthdr;   // extension headers are not walked
        l4_off = sizeof(*eth) + sizeof(*ip6);
    } else {
        return TC_PASS;
    }
    u64 len = skb->len;   // IP total length is 0 for >64 KiB GSO packets on lo
    u32 payload_off = l4_off;
    struct tcphdr th = {};
    int is_tcp = 0;
    if (k.proto == IPPROTO_TCP) {
        if (bpf_skb_load_bytes(skb, l4_off, &th, sizeof(th)) < 0)
            return TC_PASS;
        k.src.port = bpf_ntohs(th.source);
        k.dst.port = bpf_ntohs(th.dest);
        payload_off = l4_off + th.doff * 4;
        is_tcp = 1;
    } else if (k.proto == IPPROTO_UDP) {
        u16 ports[2];
        if (bpf_skb_load_bytes(skb, l4_off, ports, 4) < 0)
            return TC_PASS;
        k.src.port = bpf_ntohs(ports[0]);
        k.dst.port = bpf_ntohs(ports[1]);
        payload_off = l4_off + 8;
    }
    u64 payload = len > payload_off ? len - payload_off : 0;
    count_flow(&k, len, payload);
    count_backend(&k.dst, hook, 1, len, payload);
    count_backend(&k.src, hook, 0, len, payload);

    if (hook == HOOK_EGRESS && cfg(CFG_TC_DROP_QUARANTINED)) {
        struct quarantine_val *q = quarantine.lookup(&k.dst);
        if (q && (q->until_ns == 0 || q->until_ns > bpf_ktime_get_ns())) {
            struct event e = {};
            e.kind = EV_TC_DROP;
            e.rule = q->rule;
            e.a = k.src;
            e.b = k.dst;
            e.value = len;
            emit(&e);
            return TC_ACT_SHOT;
        }
    }
    if (hook == HOOK_EGRESS && is_tcp) {
        struct dir_key dk = {};
        dk.src = k.src;
        dk.dst = k.dst;
        walk_h2(skb, &dk, &th, payload_off, (u32)payload);
    }
    return TC_PASS;
}

int tc_ingress(struct __sk_buff *skb) { return observe(skb, HOOK_INGRESS); }
int tc_egress(struct __sk_buff *skb) { return observe(skb, HOOK_EGRESS); }

static __always_inline int redirect(struct endpoint *target, struct quarantine_val **out) {
    struct quarantine_val *q = quarantine.lookup(target);
    if (!q)
        return 0;
    if (q->until_ns && q->until_ns <= bpf_ktime_get_ns())
        return 0;   // expired: the kernel lets traffic through even if nobody cleans up
    *out = q;
    return 1;
}

int on_connect4(struct bpf_sock_addr *ctx) {
    struct endpoint t = {};
    mapped_v4(&t, ctx->user_ip4, bpf_ntohs((u16)ctx->user_port));
    struct quarantine_val *q = 0;
    if (!redirect(&t, &q) || !q)
        return 1;
    struct event e = {};
    e.kind = EV_CONNECT_REDIRECT;
    e.rule = q->rule;
    e.a = t;
    e.b = q->backup;
    if (!is_mapped_v4(&q->backup)) {
        e.result = -97;   // EAFNOSUPPORT: an IPv4 socket cannot reach an IPv6 backup
        emit(&e);
        return 1;
    }
    ctx->user_ip4 = q->backup.addr[3];
    ctx->user_port = bpf_htons(q->backup.port);
    u64 cookie = bpf_get_socket_cookie(ctx);
    redirected.update(&cookie, &t);
    emit(&e);
    return 1;
}

int on_connect6(struct bpf_sock_addr *ctx) {
    struct endpoint t = {};
    t.addr[0] = ctx->user_ip6[0];
    t.addr[1] = ctx->user_ip6[1];
    t.addr[2] = ctx->user_ip6[2];
    t.addr[3] = ctx->user_ip6[3];
    t.port = bpf_ntohs((u16)ctx->user_port);
    struct quarantine_val *q = 0;
    if (!redirect(&t, &q) || !q)
        return 1;
    struct event e = {};
    e.kind = EV_CONNECT_REDIRECT;
    e.rule = q->rule;
    e.a = t;
    e.b = q->backup;
    ctx->user_ip6[0] = q->backup.addr[0];
    ctx->user_ip6[1] = q->backup.addr[1];
    ctx->user_ip6[2] = q->backup.addr[2];
    ctx->user_ip6[3] = q->backup.addr[3];
    ctx->user_port = bpf_htons(q->backup.port);
    u64 cookie = bpf_get_socket_cookie(ctx);
    redirected.update(&cookie, &t);
    emit(&e);
    return 1;
}

// Run by user space through BPF_PROG_TEST_RUN: the packet is 14 bytes of padding then a ctl_cmd.
int ctl(struct __sk_buff *skb) {
    struct ctl_cmd c = {};
    if (bpf_skb_load_bytes(skb, ETH_HLEN, &c, sizeof(c)) < 0)
        return 1;
    struct event e = {};
    e.kind = EV_MAP_CHANGE;
    e.op = c.op;
    e.rule = c.rule;
    e.a = c.key;
    e.b = c.val;
    e.value = c.arg;
    e.value2 = c.arg2;
    int r = -22;
    if (c.op == OP_QUARANTINE_SET) {
        struct quarantine_val q = {};
        q.backup = c.val;
        q.rule = c.rule;
        q.until_ns = c.arg;
        r = quarantine.update(&c.key, &q);
    } else if (c.op == OP_QUARANTINE_DEL) {
        r = quarantine.delete(&c.key);
    } else if (c.op == OP_BACKEND_SET) {
        u32 id = (u32)c.arg;
        r = backends.update(&c.key, &id);
    } else if (c.op == OP_BACKEND_DEL) {
        r = backends.delete(&c.key);
    } else if (c.op == OP_RULE_SET) {
        u32 idx = c.rule;
        u64 budget = c.arg;
        r = rules.update(&idx, &budget);
    } else if (c.op == OP_RULE_DEL) {
        u32 idx = c.rule;
        r = rules.delete(&idx);
    } else if (c.op == OP_CONFIG_SET) {
        u32 slot = c.rule;
        u64 *v = config.lookup(&slot);
        if (v) {
            *v = c.arg;
            r = 0;
        }
    }
    e.result = r;
    emit(&e);
    return r < 0 ? (u32)(-r) : 0;
}
