/* A qemu-user TCG plugin for tools/insn_per_flop.py: it counts the guest instructions executed
 * (one 64-bit counter, bumped by an inline add at the start of every translated block), and
 * prints the count to stderr when the guest marks a point:
 *
 *     lseek(-1, CYATTN_INSN_MARK, 0)    ->  "insn_mark: <count>"
 *
 * (an lseek on fd -1 fails with EBADF and changes nothing; the plugin matches the arguments,
 * not the syscall number, so the same plugin serves qemu-aarch64 and qemu-x86_64; the fd is an
 * int, so only the low 32 bits of its register are compared). At exit it prints
 * "insn_count: <count>".
 *
 * Built by the host's gcc (gcc -O2 -shared -fPIC). QEMU's plugin header (qemu-plugin.h) is not
 * in Debian's packages, so the few declarations used are written out below; they are QEMU's
 * plugin API version 1, which the qemu-user of Debian bookworm (QEMU 7.2) loads.
 * Count with one thread (OMP_NUM_THREADS=1): the inline add is not atomic.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CYATTN_INSN_MARK 0x6379617474ULL  /* "cyatt" */
#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*atexit_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num,
                             uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                             uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id, syscall_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, atexit_cb_t cb, void *userdata);

EXPORT int qemu_plugin_version = 1;

static uint64_t count;

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count,
                                             qemu_plugin_tb_n_insns(tb));
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num,
                       uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                       uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    (void)id; (void)vcpu_index; (void)num; (void)a3;
    (void)a4; (void)a5; (void)a6; (void)a7; (void)a8;
    if ((uint32_t)a1 == UINT32_MAX && a2 == CYATTN_INSN_MARK) {
        fprintf(stderr, "insn_mark: %llu\n", (unsigned long long)count);
        fflush(stderr);
    }
}

static void at_exit_cb(qemu_plugin_id_t id, void *userdata)
{
    (void)id; (void)userdata;
    fprintf(stderr, "insn_count: %llu\n", (unsigned long long)count);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                               char **argv)
{
    (void)info; (void)argc; (void)argv;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, at_exit_cb, NULL);
    return 0;
}
