/* vmtool: the ioctls the VM oracle's scripts need that busybox lacks (fscrypt keys and
 * policies, inode flags). Built static by rext4-testkit (src/vm.rs) into the VM's initramfs.
 *
 *   vmtool add_key KEYFILE MNT        adds a v2 master key, prints its identifier in hex
 *   vmtool set_policy HEXID DIR [PAD] sets a v2 policy (AES-256-XTS/CTS, padding flags PAD)
 *   vmtool get_flags PATH             prints the inode flags in hex
 *   vmtool set_flags PATH HEXFLAGS    sets the inode flags
 */
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/fscrypt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static int fail(const char *what) {
    perror(what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "add_key")) {
        unsigned char raw[64];
        FILE *k = fopen(argv[2], "rb");
        if (!k || fread(raw, 1, 64, k) != 64) return fail("key file");
        struct fscrypt_add_key_arg *arg = calloc(1, sizeof(*arg) + 64);
        arg->key_spec.type = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
        arg->raw_size = 64;
        memcpy(arg->raw, raw, 64);
        int fd = open(argv[3], O_RDONLY);
        if (fd < 0 || ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, arg)) return fail("add_key");
        for (int i = 0; i < 16; i++) printf("%02x", arg->key_spec.u.identifier[i]);
        printf("\n");
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "set_policy")) {
        struct fscrypt_policy_v2 p = {0};
        p.version = FSCRYPT_POLICY_V2;
        p.contents_encryption_mode = FSCRYPT_MODE_AES_256_XTS;
        p.filenames_encryption_mode = FSCRYPT_MODE_AES_256_CTS;
        p.flags = argc >= 5 ? (unsigned char)strtoul(argv[4], 0, 0) : FSCRYPT_POLICY_FLAGS_PAD_32;
        for (int i = 0; i < 16; i++) {
            unsigned v;
            if (sscanf(argv[2] + 2 * i, "%2x", &v) != 1) return fail("identifier");
            p.master_key_identifier[i] = v;
        }
        int fd = open(argv[3], O_RDONLY);
        if (fd < 0 || ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, &p)) return fail("set_policy");
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "get_flags")) {
        int flags, fd = open(argv[2], O_RDONLY);
        if (fd < 0 || ioctl(fd, FS_IOC_GETFLAGS, &flags)) return fail("get_flags");
        printf("%x\n", flags);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "set_flags")) {
        int flags = (int)strtoul(argv[3], 0, 16), fd = open(argv[2], O_RDONLY);
        if (fd < 0 || ioctl(fd, FS_IOC_SETFLAGS, &flags)) return fail("set_flags");
        return 0;
    }
    fprintf(stderr, "usage: vmtool add_key|set_policy|get_flags|set_flags ...\n");
    return 2;
}
