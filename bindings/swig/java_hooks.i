/* java_hooks.i - the hooks of pq_create_with_hooks from Java (included by
 * java.i, after its handle typemaps).
 *
 * The library calls pq_hooks.log, build_done and build_progress on its worker
 * threads (a build's) or on the thread of a call. The shim below reaches
 * the io.pqcache.Hooks object the context was made with:
 *
 *  - A thread the JVM does not know (a library worker) is attached as a
 *    daemon thread named "pqcache-worker" at its first hook and stays
 *    attached (attaching per call would make a java.lang.Thread each time);
 *    a pthread key's destructor detaches it when the thread exits (a
 *    context's own pool stops its threads in pq_destroy). A daemon thread
 *    does not keep the JVM from exiting.
 *  - Hooks.fromNativeLog / fromNativeBuildDone catch what the user's code
 *    throws and hand it to the thread's uncaught-exception handler; an
 *    exception that still gets here (an Error raised in that handler) is
 *    printed to stderr and cleared: no Java exception goes into the C
 *    library. An exception already pending on a Java thread when the
 *    library logs is put back after the hook.
 *  - Each hook call runs in a local frame of its own: a worker thread never
 *    returns to Java, so its local references would otherwise pile up.
 *  - The pqj_hooks struct holds a global reference to the Hooks object;
 *    pqj_hooks_delete, which the Java layer runs after pq_destroy (which
 *    waits for the builds and their hooks), lets go of it.
 *  - A log message is passed as UTF-8 bytes, decoded in Java (invalid
 *    bytes replaced): NewStringUTF wants modified UTF-8, which a path in a
 *    message need not be.
 *
 * The allocator and disk hooks stay C only (docs/hooks.md). */

%ignore pq_hooks;
%ignore pq_hooks_default;
%ignore pq_create_with_hooks;

/* The calling thread's JNIEnv, for the functions below (no Java argument). */
%typemap(in, numinputs=0) JNIEnv* env_of_call %{ $1 = jenv; %}
%apply int* OUTPUT { int32_t* out_threads };

%{
#include <pthread.h>
#include <stdio.h>

typedef struct pqj_hooks {
  pq_hooks hooks;
  JavaVM* vm;
  jobject target;           /* global reference to the io.pqcache.Hooks */
  jmethodID on_log;         /* void fromNativeLog(int level, byte[] utf8) */
  jmethodID on_build_done;  /* void fromNativeBuildDone(long seq, int layer, int status) */
  /* void fromNativeBuildProgress(long seq, int layer, int stage, long done, long total,
   * double fraction) */
  jmethodID on_build_progress;
} pqj_hooks;

static pthread_key_t pqj_attached_key;
static pthread_once_t pqj_attached_once = PTHREAD_ONCE_INIT;
static int pqj_attached_key_made;

static void pqj_detach_at_exit(void* vm) {
  (*(JavaVM*)vm)->DetachCurrentThread((JavaVM*)vm);
}

static void pqj_make_attached_key(void) {
  pqj_attached_key_made = pthread_key_create(&pqj_attached_key, pqj_detach_at_exit) == 0;
}

/* This thread's JNIEnv, attaching the thread first if the JVM does not know
 * it; NULL (the hook is skipped, said on stderr) if that fails, as while the
 * JVM shuts down. */
static JNIEnv* pqj_env(JavaVM* vm) {
  JNIEnv* env = NULL;
  JavaVMAttachArgs args;
  jint got = (*vm)->GetEnv(vm, (void**)&env, JNI_VERSION_1_8);
  if (got == JNI_OK) return env;
  if (got != JNI_EDETACHED) return NULL;
  pthread_once(&pqj_attached_once, pqj_make_attached_key);
  if (!pqj_attached_key_made) { /* could not detach it at exit: do not attach */
    fprintf(stderr, "pqcache: no thread key to detach worker threads; Java hooks skipped\n");
    return NULL;
  }
  args.version = JNI_VERSION_1_8;
  args.name = (char*)"pqcache-worker";
  args.group = NULL;
  if ((*vm)->AttachCurrentThreadAsDaemon(vm, (void**)&env, &args) != JNI_OK) {
    fprintf(stderr, "pqcache: a worker thread could not attach to the JVM; Java hook skipped\n");
    return NULL;
  }
  pthread_setspecific(pqj_attached_key, vm);
  return env;
}

/* Before a hook's Java call: a new local frame, with an exception pending
 * on this thread set aside (no Java method may run while one is pending).
 * NULL env or a refused frame: skip the hook. */
static JNIEnv* pqj_enter(const pqj_hooks* h, jthrowable* pending) {
  JNIEnv* env = pqj_env(h->vm);
  *pending = NULL;
  if (env == NULL) return NULL;
  if ((*env)->ExceptionCheck(env)) {
    *pending = (*env)->ExceptionOccurred(env);
    (*env)->ExceptionClear(env);
  }
  if ((*env)->PushLocalFrame(env, 4) != 0) { /* OutOfMemoryError */
    (*env)->ExceptionClear(env);
    if (*pending != NULL) (*env)->Throw(env, *pending);
    return NULL;
  }
  return env;
}

/* After it: nothing thrown goes on into C; the set-aside exception is back. */
static void pqj_leave(JNIEnv* env, jthrowable pending, const char* hook) {
  if ((*env)->ExceptionCheck(env)) {
    fprintf(stderr, "pqcache: the Java %s hook threw past its handler:\n", hook);
    (*env)->ExceptionDescribe(env); /* prints and clears it */
    (*env)->ExceptionClear(env);
  }
  (*env)->PopLocalFrame(env, NULL);
  if (pending != NULL) (*env)->Throw(env, pending);
}

static void pqj_log_hook(void* user, int32_t level, const char* message) {
  const pqj_hooks* h = (const pqj_hooks*)user;
  jthrowable pending;
  JNIEnv* env = pqj_enter(h, &pending);
  jbyteArray bytes;
  jsize length = (jsize)strlen(message);
  if (env == NULL) return;
  bytes = (*env)->NewByteArray(env, length);
  if (bytes != NULL) {
    (*env)->SetByteArrayRegion(env, bytes, 0, length, (const jbyte*)message);
    (*env)->CallVoidMethod(env, h->target, h->on_log, (jint)level, bytes);
  }
  pqj_leave(env, pending, "log");
}

static void pqj_build_done_hook(void* user, uint64_t seq_id, int32_t layer, pq_status status) {
  const pqj_hooks* h = (const pqj_hooks*)user;
  jthrowable pending;
  JNIEnv* env = pqj_enter(h, &pending);
  if (env == NULL) return;
  (*env)->CallVoidMethod(env, h->target, h->on_build_done, (jlong)seq_id, (jint)layer,
                         (jint)status);
  pqj_leave(env, pending, "build-done");
}

static void pqj_build_progress_hook(void* user, const pq_build_progress* p) {
  const pqj_hooks* h = (const pqj_hooks*)user;
  jthrowable pending;
  JNIEnv* env = pqj_enter(h, &pending);
  if (env == NULL) return;
  (*env)->CallVoidMethod(env, h->target, h->on_build_progress, (jlong)p->seq_id, (jint)p->layer,
                         (jint)p->stage, (jlong)p->done, (jlong)p->total, (jdouble)p->fraction);
  pqj_leave(env, pending, "build-progress");
}
%}

%inline %{
/* Hooks calling target's fromNativeLog (when log is non-zero) at log_level,
 * fromNativeBuildDone (when build_done is non-zero) and
 * fromNativeBuildProgress (when build_progress is non-zero), on pool (NULL:
 * the context's own). NULL with a Java exception pending when they cannot be
 * made. Free with pqj_hooks_delete after the context's pq_destroy. */
pqj_hooks* pqj_hooks_new(JNIEnv* env_of_call, jobject target, int32_t log_level, int32_t log,
                         int32_t build_done, int32_t build_progress, pq_pool* pool) {
  JNIEnv* env = env_of_call;
  pqj_hooks* h;
  jclass type;
  if (target == NULL) {
    SWIG_JavaThrowException(env, SWIG_JavaNullPointerException, "pqj_hooks_new: target is null");
    return NULL;
  }
  h = (pqj_hooks*)calloc(1, sizeof *h);
  if (h == NULL) {
    SWIG_JavaThrowException(env, SWIG_JavaOutOfMemoryError, "pqj_hooks_new: out of memory");
    return NULL;
  }
  pq_hooks_default(&h->hooks);
  h->hooks.log_level = log_level;
  h->hooks.pool = pool;
  type = (*env)->GetObjectClass(env, target);
  h->on_log = (*env)->GetMethodID(env, type, "fromNativeLog", "(I[B)V");
  h->on_build_done = h->on_log ? (*env)->GetMethodID(env, type, "fromNativeBuildDone", "(JII)V")
                               : NULL;
  h->on_build_progress =
      h->on_build_done ? (*env)->GetMethodID(env, type, "fromNativeBuildProgress", "(JIIJJD)V")
                       : NULL;
  if (h->on_build_progress == NULL || (*env)->GetJavaVM(env, &h->vm) != 0 ||
      (h->target = (*env)->NewGlobalRef(env, target)) == NULL) {
    if (!(*env)->ExceptionCheck(env))
      SWIG_JavaThrowException(env, SWIG_JavaRuntimeException, "pqj_hooks_new: no JavaVM");
    free(h);
    return NULL;
  }
  if (log) {
    h->hooks.log = pqj_log_hook;
    h->hooks.log_user = h;
  }
  if (build_done) {
    h->hooks.build_done = pqj_build_done_hook;
    h->hooks.build_done_user = h;
  }
  if (build_progress) {
    h->hooks.build_progress = pqj_build_progress_hook;
    h->hooks.build_progress_user = h;
  }
  return h;
}

void pqj_hooks_delete(JNIEnv* env_of_call, pqj_hooks* hooks) {
  if (hooks == NULL) return;
  (*env_of_call)->DeleteGlobalRef(env_of_call, hooks->target);
  free(hooks);
}

/* pq_create_with_hooks with hooks from pqj_hooks_new. */
pq_status pqj_create_with_hooks(const pq_config* config, const pqj_hooks* hooks,
                                pq_context** out) {
  return pq_create_with_hooks(config, hooks ? &hooks->hooks : NULL, out);
}
%}
