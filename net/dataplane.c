/* dataplane.c: being written. */
