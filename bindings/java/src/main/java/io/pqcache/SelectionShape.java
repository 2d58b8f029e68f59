package io.pqcache;

/**
 * The rows of a multi-token selection and the positions each row holds
 * ({@link PqContext#selectionCapacityMulti}).
 */
public record SelectionShape(int rows, int capacity) {}
