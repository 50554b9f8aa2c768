/* A library that defines no row function of its own but depends on one that does (as ggml's libggml-cpu.so
 * depends on libggml-base.so, where quantize_row_<fmt>_ref lives): dlsym on it finds the dependency's symbols.
 * Build: cc -O2 -shared -fPIC wrapper.c -o libwrapper.so -L. -lq8_0 -Wl,-rpath,$PWD */
int wrapper_marker(void) { return 19; }
