/* rpc.c: being written. */
